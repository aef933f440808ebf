//! The router state without `impl FromRef<AppState> for Idempotency`: the macro cannot
//! see the router's state, so this pins what the user gets (the symptom the macro's docs
//! map to the fix): Rust infers the state to be `Idempotency`, and `.with_state` names it.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use idempotent_runtime::store::MemoryStore;
use idempotent_runtime::{Idempotency, idempotent};

#[derive(Clone)]
struct AppState {
    engine: Idempotency,
}

#[idempotent(scope = caller)]
async fn create(caller: String, State(app): State<AppState>) -> StatusCode {
    let _ = (caller, app.engine);
    StatusCode::CREATED
}

fn main() {
    let state = AppState { engine: Idempotency::new(MemoryStore::new()) };
    let _app: Router = Router::new().route("/notes", post(create)).with_state(state);
}
