//! Helpers shared by the end-to-end tests: the payments demo on a real SQLite file,
//! request builders, and response readers; demo processes and test databases in
//! [`process`].

pub(crate) mod process;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use idempotent_demo::database;
use idempotent_demo::gateway::api::{self, GatewayClient};
use idempotent_demo::gateway::{Gateway, KeyHandling};
use idempotent_runtime::{Idempotency, Store};
use tower::ServiceExt;

use idempotent_demo::mailer::Mailer;
use idempotent_demo::payments::{
    AppState, Authorise, DEMO_WEBHOOK_SECRET, Ledger, PauseAfterStep, router,
};
use idempotent_runtime::webhook::WebhookVerifier;

/// The payments demo on an SQLite file in `dir`.
pub(crate) async fn payments_app(dir: &std::path::Path, latency: Duration) -> (Router, Gateway) {
    let demo = payments_demo(dir, latency).await;
    (demo.app, demo.gateway)
}

/// The payments demo's router and the parts behind it, to look at its effects.
pub(crate) struct PaymentsDemo {
    pub(crate) app: Router,
    pub(crate) gateway: Gateway,
    pub(crate) mailer: Mailer,
    pub(crate) ledger: Ledger,
}

/// The payments demo on an SQLite file in `dir`, as [`PaymentsDemo`].
pub(crate) async fn payments_demo(dir: &std::path::Path, latency: Duration) -> PaymentsDemo {
    payments_demo_routed(dir, latency, |gateway| async move {
        GatewayClient::new(gateway)
    })
    .await
}

/// [`payments_demo`], its handler reaching the gateway through the client `route` makes
/// for the gateway's address (through a fault proxy in front of it, say).
pub(crate) async fn payments_demo_routed<Route, Routed>(
    dir: &std::path::Path,
    latency: Duration,
    route: Route,
) -> PaymentsDemo
where
    Route: FnOnce(SocketAddr) -> Routed,
    Routed: Future<Output = GatewayClient>,
{
    payments_demo_with(dir, latency, route, DemoVariant::default()).await
}

/// What a test changes in the demo: how its gateway treats keys, how `authorise` runs,
/// and a wrapper around its store (a fault injector, say).
#[derive(Default)]
pub(crate) struct DemoVariant {
    pub(crate) keys: KeyHandling,
    pub(crate) authorise: Authorise,
    pub(crate) wrap_store: Option<WrapStore>,
}

/// What [`DemoVariant::wrap_store`] does with the demo's store.
pub(crate) type WrapStore = Box<dyn FnOnce(Arc<dyn Store>) -> Arc<dyn Store>>;

/// [`payments_demo_routed`], as `variant` says.
pub(crate) async fn payments_demo_with<Route, Routed>(
    dir: &std::path::Path,
    latency: Duration,
    route: Route,
    variant: DemoVariant,
) -> PaymentsDemo
where
    Route: FnOnce(SocketAddr) -> Routed,
    Routed: Future<Output = GatewayClient>,
{
    let url = format!("sqlite://{}", dir.join("payments.db").display());
    let (db, store) = database::open(&url).await.expect("open demo database");
    let store = match variant.wrap_store {
        Some(wrap) => wrap(store),
        None => store,
    };
    let gateway = Gateway::new(db.clone(), latency)
        .await
        .expect("gateway schema")
        .with_keys(variant.keys);
    let gateway_addr = api::serve(gateway.clone(), ([127, 0, 0, 1], 0).into())
        .await
        .expect("serve the gateway");
    let gateway_client = route(gateway_addr).await;
    let ledger = Ledger::new(db, true).await.expect("ledger schema");
    let mailer = Mailer::default();
    let idempotency = Idempotency::builder_shared(store).build();
    let app = router(AppState {
        idempotency,
        gateway: gateway.clone(),
        gateway_client,
        mailer: mailer.clone(),
        ledger: ledger.clone(),
        pause: PauseAfterStep::default(),
        webhooks: WebhookVerifier::new([DEMO_WEBHOOK_SECRET]).expect("the demo secret parses"),
        authorise: variant.authorise,
    });
    PaymentsDemo {
        app,
        gateway,
        mailer,
        ledger,
    }
}

/// `POST /payments` as `api_key` with `idempotency_key` (raw header value) and `body`.
pub(crate) fn post_payment(
    api_key: &str,
    idempotency_key: Option<&str>,
    body: &str,
) -> Request<Body> {
    let mut request = Request::post("/payments")
        .header("authorization", format!("Bearer {api_key}"))
        .header("content-type", "application/json");
    if let Some(key) = idempotency_key {
        request = request.header("idempotency-key", key);
    }
    request.body(Body::from(body.to_owned())).expect("request")
}

/// A response, read whole.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Vec<u8>,
}

impl Answer {
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|_| panic!("JSON body, got {:?}", String::from_utf8_lossy(&self.body)))
    }

    pub(crate) fn code(&self) -> String {
        self.json()["code"].as_str().unwrap_or_default().to_owned()
    }

    pub(crate) fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// Sends `request` to `app` in-process.
pub(crate) async fn send(app: &Router, request: Request<Body>) -> Answer {
    let response = app.clone().oneshot(request).await.expect("infallible");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("body").to_bytes().to_vec();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}
