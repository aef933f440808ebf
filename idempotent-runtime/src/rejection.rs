//! [`AsProblem`]: answer an extractor's rejection as `application/problem+json`, so a
//! client sees one error format whether the library, your handler or an extractor (bad
//! JSON, a wrong `Content-Type`, a bad query string) refused the request.
//!
//! ```
//! use axum::{Json, Router, routing::post};
//! use idempotent_runtime::rejection::AsProblem;
//!
//! #[derive(serde::Deserialize)]
//! struct Deposit {
//!     amount: i64,
//! }
//!
//! // `{not json` is answered `400` with `Content-Type: application/problem+json`
//! // instead of axum's `text/plain`.
//! async fn deposit(AsProblem(Json(deposit)): AsProblem<Json<Deposit>>) -> String {
//!     deposit.amount.to_string()
//! }
//!
//! let app: Router = Router::new().route("/deposits", post(deposit));
//! ```
//!
//! It also wraps the last argument of an `#[idempotent]` handler
//! (`AsProblem(Json(request)): AsProblem<Json<ChargeRequest>>`): the rejection is answered
//! before the key is claimed, so nothing is stored, exactly as without the wrapper.

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::response::{IntoResponse, Response};
use http::request::Parts;
use http::{HeaderValue, header};

use crate::problem::{PROBLEM_JSON, Problem, sentence};

/// How much of a rejection's body becomes the `detail`; axum's messages are one line.
const MAX_DETAIL_BYTES: usize = 16 * 1024;

/// Wraps an extractor `T` and answers its rejection as problem+json: the same status and
/// headers, its message as `detail` (first letter capitalised, ending in a full stop), a
/// `code` and `title` named after the status (`400` → `bad_request` / "Bad Request",
/// `413` → `payload_too_large`, `415` → `unsupported_media_type`, `422` →
/// `unprocessable_entity`). A rejection that already is problem+json passes unchanged.
///
/// Works for body extractors (`Json`, `Form`, `Bytes`, …) and for request-head
/// extractors (`Query`, `Path`, `TypedHeader`, …), anywhere in a handler's arguments.
///
/// Behind an [`IdempotencyLayer`](crate::layer::IdempotencyLayer) (where the handler's
/// extractors run after the key was claimed) a rejection answered through `AsProblem` is
/// not recorded: the key is released, so the corrected request can reuse it — as with
/// the attribute, which extracts before it claims.
#[derive(Debug, Clone, Copy, Default)]
pub struct AsProblem<T>(pub T);

impl<S, T> FromRequest<S> for AsProblem<T>
where
    S: Send + Sync,
    T: FromRequest<S>,
{
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        // The rejection becomes a `Response` before the await: `T::Rejection` need not be
        // `Send`.
        let rejection = match T::from_request(req, state).await {
            Ok(value) => return Ok(Self(value)),
            Err(rejection) => rejection.into_response(),
        };
        Err(problem_from(rejection).await)
    }
}

impl<S, T> FromRequestParts<S> for AsProblem<T>
where
    S: Send + Sync,
    T: FromRequestParts<S>,
{
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        // The rejection becomes a `Response` before the await: `T::Rejection` need not be
        // `Send`.
        let rejection = match T::from_request_parts(parts, state).await {
            Ok(value) => return Ok(Self(value)),
            Err(rejection) => rejection.into_response(),
        };
        Err(problem_from(rejection).await)
    }
}

/// Marks a response as an extractor's rejection (a response extension): the request was
/// refused before the handler ran, so the engine releases the key instead of recording
/// the answer. Only matters behind an [`IdempotencyLayer`](crate::layer::IdempotencyLayer),
/// where extractors run after the claim; the attribute extracts before claiming.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ExtractorRejection;

/// `rejection` as problem+json (see [`AsProblem`]).
pub(crate) async fn problem_from(rejection: Response) -> Response {
    let is_problem = rejection
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(PROBLEM_JSON.as_bytes()));
    if is_problem {
        let mut rejection = rejection;
        rejection.extensions_mut().insert(ExtractorRejection);
        return rejection;
    }
    let (parts, body) = rejection.into_parts();
    // A rejection's body is an in-memory message; one that cannot be read gets a generic
    // detail rather than no answer.
    let message = axum::body::to_bytes(body, MAX_DETAIL_BYTES)
        .await
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_default();
    let status = parts.status;
    let title = status.canonical_reason().unwrap_or("Request rejected");
    let code = title.to_ascii_lowercase().replace([' ', '-'], "_");
    let detail = sentence(&message).unwrap_or_else(|| "The request was rejected.".to_owned());
    let mut response = Problem::new(status, &code, title, detail).into_response();
    // Keep what the rejection said in headers (`Allow`, `WWW-Authenticate`, …); the
    // body, and so its type and length, are ours.
    let mut name = None;
    for (next, value) in parts.headers {
        name = next.or(name);
        if let Some(name) = &name
            && *name != header::CONTENT_TYPE
            && *name != header::CONTENT_LENGTH
        {
            response.headers_mut().append(name.clone(), value);
        }
    }
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    response.extensions_mut().insert(ExtractorRejection);
    response
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::body::Body;
    use axum::extract::{FromRef, Path, State};
    use axum::routing::{get, post};
    use axum::{Json, Router};
    use http::{HeaderMap, StatusCode};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;
    use crate::engine::Idempotency;
    use crate::store::MemoryStore;

    #[derive(Debug, serde::Deserialize)]
    struct Deposit {
        amount: i64,
    }

    async fn deposit(AsProblem(Json(deposit)): AsProblem<Json<Deposit>>) -> String {
        deposit.amount.to_string()
    }

    /// A request-head extractor before a body extractor: `AsProblem` as
    /// `FromRequestParts`.
    async fn page_then_body(
        AsProblem(Path(page)): AsProblem<Path<u32>>,
        AsProblem(Json(deposit)): AsProblem<Json<Deposit>>,
    ) -> String {
        format!("{page} {}", deposit.amount)
    }

    /// An extractor whose rejection carries a header and plain text.
    struct Authenticated;

    impl<S: Send + Sync> FromRequestParts<S> for Authenticated {
        type Rejection = (StatusCode, HeaderMap, &'static str);

        async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
            if parts.headers.contains_key(header::AUTHORIZATION) {
                return Ok(Self);
            }
            let mut headers = HeaderMap::new();
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            Err((StatusCode::UNAUTHORIZED, headers, "  send a bearer token "))
        }
    }

    /// An extractor that already rejects with a problem.
    struct AlreadyProblem;

    impl<S: Send + Sync> FromRequestParts<S> for AlreadyProblem {
        type Rejection = Problem;

        async fn from_request_parts(_: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
            Err(Problem::new(
                StatusCode::FORBIDDEN,
                "forbidden_account",
                "Forbidden",
                "This account may not pay.",
            ))
        }
    }

    fn app() -> Router {
        Router::new()
            .route("/deposits", post(deposit))
            .route("/pages/{page}", post(page_then_body))
            .route(
                "/authenticated",
                get(|AsProblem(Authenticated): AsProblem<Authenticated>| async { "in" }),
            )
            .route(
                "/forbidden",
                get(|AsProblem(AlreadyProblem): AsProblem<AlreadyProblem>| async { "in" }),
            )
    }

    struct Answer {
        status: StatusCode,
        headers: HeaderMap,
        body: Vec<u8>,
    }

    impl Answer {
        fn problem(&self) -> serde_json::Value {
            assert_eq!(
                self.headers[header::CONTENT_TYPE],
                PROBLEM_JSON,
                "body {:?}",
                String::from_utf8_lossy(&self.body)
            );
            serde_json::from_slice(&self.body).expect("a JSON problem")
        }
    }

    async fn send(app: &Router, request: Request) -> Answer {
        let response = app.clone().oneshot(request).await.expect("infallible");
        let (parts, body) = response.into_parts();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body: body.collect().await.unwrap().to_bytes().to_vec(),
        }
    }

    fn post_json(uri: &str, body: &'static str) -> Request {
        Request::post(uri)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body))
            .unwrap()
    }

    #[tokio::test]
    async fn malformed_json_is_a_400_problem_with_axums_message() {
        let answer = send(&app(), post_json("/deposits", "{not json")).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST);
        let problem = answer.problem();
        assert_eq!(problem["status"], 400);
        assert_eq!(problem["code"], "bad_request");
        assert_eq!(problem["title"], "Bad Request");
        assert_eq!(problem["type"], "urn:idempotent:problem:bad_request");
        let detail = problem["detail"].as_str().unwrap();
        assert!(
            detail.starts_with("Failed to parse the request body as JSON") && detail.ends_with('.'),
            "{detail}"
        );
        assert_eq!(
            answer.headers[header::CONTENT_LENGTH],
            answer.body.len().to_string(),
            "the length is the problem's, not the rejection's"
        );
    }

    #[tokio::test]
    async fn each_rejection_keeps_its_status() {
        let wrong_type = Request::post("/deposits")
            .header(header::CONTENT_TYPE, "text/plain")
            .body(Body::from("{\"amount\": 1}"))
            .unwrap();
        let answer = send(&app(), wrong_type).await;
        assert_eq!(answer.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert_eq!(answer.problem()["code"], "unsupported_media_type");

        let wrong_shape = send(&app(), post_json("/deposits", "{\"amount\": \"x\"}")).await;
        assert_eq!(wrong_shape.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(wrong_shape.problem()["code"], "unprocessable_entity");

        let good = send(&app(), post_json("/deposits", "{\"amount\": 7}")).await;
        assert_eq!(
            (good.status, good.body.as_slice()),
            (StatusCode::OK, &b"7"[..])
        );
    }

    #[tokio::test]
    async fn request_head_extractors_are_wrapped_too() {
        let bad_path = send(&app(), post_json("/pages/many", "{\"amount\": 1}")).await;
        assert_eq!(bad_path.status, StatusCode::BAD_REQUEST);
        let detail = bad_path.problem()["detail"].as_str().unwrap().to_owned();
        assert!(detail.starts_with("Invalid URL"), "{detail}");

        let good = send(&app(), post_json("/pages/5", "{\"amount\": 1}")).await;
        assert_eq!(
            (good.status, good.body.as_slice()),
            (StatusCode::OK, &b"5 1"[..])
        );
    }

    #[tokio::test]
    async fn headers_are_kept_and_plain_text_becomes_a_sentence() {
        let request = Request::get("/authenticated").body(Body::empty()).unwrap();
        let answer = send(&app(), request).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
        assert_eq!(answer.headers[header::WWW_AUTHENTICATE], "Bearer");
        let problem = answer.problem();
        assert_eq!(problem["detail"], "Send a bearer token.");
        assert_eq!(problem["code"], "unauthorized");
    }

    #[tokio::test]
    async fn a_problem_rejection_passes_unchanged() {
        let request = Request::get("/forbidden").body(Body::empty()).unwrap();
        let answer = send(&app(), request).await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN);
        let problem = answer.problem();
        assert_eq!(problem["code"], "forbidden_account");
        assert_eq!(problem["detail"], "This account may not pay.");
    }

    #[test]
    fn sentences() {
        assert_eq!(
            sentence("  already fine. ").as_deref(),
            Some("Already fine.")
        );
        assert_eq!(sentence("ümlaut first").as_deref(), Some("Ümlaut first."));
        assert_eq!(sentence("Why?").as_deref(), Some("Why?"));
        assert_eq!(sentence(" \n "), None);
    }

    #[derive(Clone)]
    struct Engine {
        idempotency: Idempotency,
        runs: Arc<AtomicUsize>,
    }

    impl FromRef<Engine> for Idempotency {
        fn from_ref(state: &Engine) -> Self {
            state.idempotency.clone()
        }
    }

    /// The one caller of the idempotent test handler.
    struct Caller;

    impl<S: Send + Sync> FromRequestParts<S> for Caller {
        type Rejection = StatusCode;

        async fn from_request_parts(_: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
            Ok(Self)
        }
    }

    impl crate::scope::Scope for Caller {
        fn scope(&self) -> std::borrow::Cow<'_, str> {
            "acct_test".into()
        }
    }

    #[crate::idempotent(scope = caller, crate = "crate")]
    async fn idempotent_deposit(
        caller: Caller,
        State(engine): State<Engine>,
        AsProblem(Json(deposit)): AsProblem<Json<Deposit>>,
    ) -> (StatusCode, String) {
        let _ = caller;
        engine.runs.fetch_add(1, Ordering::SeqCst);
        (StatusCode::CREATED, deposit.amount.to_string())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn inside_an_idempotent_handler_nothing_is_claimed() {
        let runs = Arc::new(AtomicUsize::new(0));
        let state = Engine {
            idempotency: Idempotency::new(MemoryStore::new()),
            runs: runs.clone(),
        };
        let app = Router::new()
            .route("/deposits", post(idempotent_deposit))
            .with_state(state);
        let request = |body: &'static str| {
            let mut request = post_json("/deposits", body);
            request
                .headers_mut()
                .insert("idempotency-key", HeaderValue::from_static("d-1"));
            request
        };

        let garbage = send(&app, request("{not json")).await;
        assert_eq!(garbage.status, StatusCode::BAD_REQUEST);
        assert_eq!(garbage.problem()["code"], "bad_request");
        assert_eq!(runs.load(Ordering::SeqCst), 0);

        // The refused request claimed nothing: the same key runs with a good body, once.
        let first = send(&app, request("{\"amount\": 5}")).await;
        assert_eq!(first.status, StatusCode::CREATED);
        assert!(!first.headers.contains_key("idempotent-replayed"));
        let replay = send(&app, request("{\"amount\": 5}")).await;
        assert_eq!(replay.headers["idempotent-replayed"], "true");
        assert_eq!(replay.body, b"5");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}
