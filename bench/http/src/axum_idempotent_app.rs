//! The handler behind axum-idempotent 0.6 in its `Idempotency-Key` header mode, over
//! ruts' in-memory (moka) session store.
//!
//! axum-idempotent stores responses in the caller's session and caches nothing for a
//! request without one, so the app also serves `POST /session`, which starts a session and
//! answers its cookie; the driver sends that cookie with every request.

use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum_idempotent::{IdempotentLayer, IdempotentOptions};
use ruts::store::Ttl;
use ruts::store::moka::MokaStore;
use ruts::{CookieOptions, Session, SessionLayer};
use tower_cookies::CookieManagerLayer;

use crate::order::{self, Counters};

/// How long a response is kept, as for the other variants (10 minutes).
const CACHE_SECONDS: i64 = 600;

/// The app: the order routes inside the idempotency layer, all inside the session layer.
pub fn router(counters: Counters) -> Router {
    let sessions = Arc::new(MokaStore::builder().build());
    let options = IdempotentOptions::default()
        .use_idempotency_key_header(Some("Idempotency-Key"), true)
        .expire_after(CACHE_SECONDS);
    let cookie = CookieOptions::build()
        .name("session")
        .path("/")
        .max_age(CACHE_SECONDS as u64);
    Router::new()
        .route("/orders", post(order::create_order))
        .route("/orders/slow", post(order::create_slow_order))
        .layer(IdempotentLayer::<MokaStore>::new(options))
        .route("/session", post(start_session))
        .layer(SessionLayer::new(sessions).with_cookie_options(cookie))
        .layer(CookieManagerLayer::new())
        .route("/stats", get(order::stats))
        .with_state(counters)
}

/// `POST /session`: stores one field, which starts the session and sets its cookie.
async fn start_session(session: Session<MokaStore>) -> StatusCode {
    let ttl = Ttl::new(CACHE_SECONDS).expect("a positive TTL");
    match session.set("started", &true, ttl, None).await {
        Ok(()) => StatusCode::NO_CONTENT,
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}
