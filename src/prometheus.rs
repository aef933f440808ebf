//! `GET /metrics`: what the engine records (`idempotent_runtime::metrics`) in the
//! Prometheus text format, through `metrics-exporter-prometheus`.
//!
//! The library installs no recorder; the demo binaries do, here ([`install`], called by
//! [`serve::start`](crate::serve::start)), and [`serve`](crate::serve::serve) adds the
//! route. The endpoint is not authenticated: in production, serve it on an internal port
//! or behind your own checks.

use std::sync::OnceLock;
use std::time::Duration;

use axum::Router;
use axum::response::IntoResponse;
use axum::routing::get;
use http::header;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// The Prometheus text exposition format's content type.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Histogram buckets, in seconds: from a memory store's microseconds to the default store
/// timeout (5 s) and beyond, for handler durations.
const BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The process's Prometheus recorder, installed as the global `metrics` recorder on the
/// first call; later calls return the same handle. If another recorder was installed
/// first (a test harness, say), it stays and `/metrics` shows nothing of the engine:
/// a warning says so, and nothing panics.
pub fn install() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let builder = || {
            PrometheusBuilder::new()
                .set_buckets(&BUCKETS)
                .expect("the buckets are not empty")
        };
        let handle = builder().install_recorder().unwrap_or_else(|err| {
            tracing::warn!(error = %err, "no Prometheus recorder installed; /metrics stays empty");
            builder().build_recorder().handle()
        });
        idempotent_runtime::metrics::describe();
        handle
    })
}

/// `GET /metrics` over the recorder [`install`] set up (installing it if needed), and a
/// background task that keeps its histograms compact. Call it inside the Tokio runtime.
pub fn routes() -> Router {
    let handle = install();
    static UPKEEP: OnceLock<()> = OnceLock::new();
    UPKEEP.get_or_init(|| {
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(Duration::from_secs(5));
            loop {
                ticker.tick().await;
                handle.run_upkeep();
            }
        });
    });
    Router::new().route("/metrics", get(render))
}

/// `GET /metrics`: the current metrics in the Prometheus text format.
async fn render() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], install().render())
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use http::{Request, StatusCode};
    use tower::ServiceExt;

    use super::*;

    /// Tests and multi-router processes build the routes more than once: one recorder,
    /// no panic, every copy serves it.
    #[tokio::test]
    async fn installing_and_routing_twice_share_one_recorder() {
        assert!(std::ptr::eq(install(), install()));
        for app in [routes(), routes()] {
            let request = Request::get("/metrics").body(Body::empty()).unwrap();
            let response = app.oneshot(request).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            assert_eq!(response.headers()[header::CONTENT_TYPE], CONTENT_TYPE);
        }
    }
}
