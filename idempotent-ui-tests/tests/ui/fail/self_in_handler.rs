use axum::extract::State;
use axum::http::StatusCode;
use idempotent_runtime::idempotent;

#[derive(Clone)]
struct App;

impl App {
    #[idempotent(scope = caller)]
    async fn create(caller: String, State(app): State<Self>) -> StatusCode {
        let _ = (caller, app);
        StatusCode::CREATED
    }
}

fn main() {
    let _ = App::create;
}
