//! Compile-time tests of `#[idempotent]`: mistakes that must be refused with a helpful,
//! well-placed error (the handlers that must compile are `pass.rs`).
//!
//! Regenerate the expected errors with `TRYBUILD=overwrite cargo test -p
//! idempotent-ui-tests`, then read every changed `.stderr`: each error must point at the
//! user's token, and teach the fix.

#[test]
fn ui() {
    // Only mistakes here: the cases that must compile are test targets (`pass.rs`), so
    // trybuild checks without generating code.
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
}

/// Expansions compiled into this test target, so that the workspace's
/// `cargo clippy --all-targets` lints generated code too (trybuild runs rustc only).
#[deny(unused_qualifications, dead_code, clippy::all, clippy::pedantic)]
mod expansion_passes_clippy {
    use std::borrow::Cow;

    use axum::extract::{FromRequestParts, Path, Query, State};
    use axum::http::request::Parts;
    use axum::http::{HeaderMap, Method, StatusCode, Uri};
    use axum::response::{IntoResponse, Response};
    use axum::routing::post;
    use axum::{Json, Router};
    use idempotent_runtime::store::MemoryStore;
    use idempotent_runtime::{Idempotency, IdempotencyKey, Postgres, Scope, Tx, idempotent};

    struct Caller(String);

    impl<S: Send + Sync> FromRequestParts<S> for Caller {
        type Rejection = Response;

        async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
            parts
                .headers
                .get("authorization")
                .and_then(|value| value.to_str().ok())
                .map(|value| Self(value.to_owned()))
                .ok_or_else(|| StatusCode::UNAUTHORIZED.into_response())
        }
    }

    impl Scope for Caller {
        fn scope(&self) -> Cow<'_, str> {
            Cow::Borrowed(&self.0)
        }
    }

    #[idempotent(scope = caller, ttl = "24h", lease = "10s", fingerprint = "json")]
    async fn create(
        caller: Caller,
        key: IdempotencyKey,
        State(engine): State<Idempotency>,
        Json(body): Json<serde_json::Value>,
    ) -> Result<(StatusCode, Json<serde_json::Value>), StatusCode> {
        let _ = engine.header_name();
        if body.is_null() {
            return Err(StatusCode::UNPROCESSABLE_ENTITY);
        }
        let derived = key.derive("create");
        Ok((
            StatusCode::CREATED,
            Json(serde_json::json!([caller.0, derived, body])),
        ))
    }

    #[idempotent(scope = caller, on_server_error = store, exclude_headers = ["x-request-id"])]
    async fn seven_extractors(
        caller: Caller,
        Path(id): Path<u32>,
        Query(query): Query<Vec<(String, String)>>,
        method: Method,
        uri: Uri,
        headers: HeaderMap,
        body: String,
    ) -> impl IntoResponse {
        let cost = format!("{}", id as usize + query.len() + headers.len() + body.len());
        (
            [("x-request-cost", cost)],
            format!("{} {method} {uri}", caller.0),
        )
    }

    #[idempotent(scope = caller, key = optional)]
    async fn optional_key(caller: Caller, key: Option<IdempotencyKey>) -> String {
        key.map_or_else(|| caller.0, |key| key.derive("optional"))
    }

    #[idempotent(scope = caller)]
    async fn no_body(caller: Caller) -> StatusCode {
        if caller.0.is_empty() {
            StatusCode::BAD_REQUEST
        } else {
            StatusCode::NO_CONTENT
        }
    }

    #[idempotent(scope = caller)]
    async fn transactional(
        caller: Caller,
        tx: &mut Tx<Postgres>,
        body: String,
    ) -> Result<StatusCode, StatusCode> {
        sqlx::query("INSERT INTO notes (account, body) VALUES ($1, $2)")
            .bind(caller.0)
            .bind(body)
            .execute(tx.conn())
            .await
            .map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?;
        Ok(StatusCode::CREATED)
    }

    #[derive(serde::Serialize)]
    struct Order {
        id: String,
        cents: u64,
    }

    /// A consumer function (`key = …`): the engine as an argument, the one value the
    /// payload, the claimed key for a downstream key.
    #[idempotent(key = order.id, scope = "orders", ttl = "24h")]
    async fn charge(
        idempotency: &Idempotency,
        order: Order,
        key: IdempotencyKey,
    ) -> Result<(u64, String), String> {
        Ok((order.cents, key.derive("gateway")))
    }

    /// A transactional consumer function with the engine and scope from expressions.
    #[idempotent(engine = idempotency, key = order.id, scope = tenant, payload = order)]
    async fn book(
        idempotency: Idempotency,
        tenant: String,
        order: Order,
        tx: &mut Tx<Postgres>,
    ) -> Result<u64, String> {
        sqlx::query("INSERT INTO ledger (tenant, id) VALUES ($1, $2)")
            .bind(tenant)
            .bind(order.id)
            .execute(tx.conn())
            .await
            .map_err(|err| err.to_string())?;
        let _ = idempotency.header_name();
        Ok(order.cents)
    }

    #[test]
    fn consumer_functions_return_outcomes() {
        let engine = Idempotency::new(MemoryStore::new());
        let order = || Order {
            id: "o_1".to_owned(),
            cents: 1,
        };
        let _charging = charge(&engine, order());
        let _booking = book(engine.clone(), "acme".to_owned(), order());
    }

    #[test]
    fn handlers_route() {
        let _app: Router = Router::new()
            .route("/create", post(create))
            .route("/wide/{id}", post(seven_extractors))
            .route("/ping", post(no_body))
            .route("/optional", post(optional_key))
            .route("/notes", post(transactional))
            .with_state(Idempotency::new(MemoryStore::new()));
    }
}
