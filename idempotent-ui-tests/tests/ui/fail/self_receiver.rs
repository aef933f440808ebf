use axum::http::StatusCode;
use idempotent_runtime::idempotent;

struct Payments;

impl Payments {
    #[idempotent(scope = caller)]
    async fn create(&self, caller: String) -> StatusCode {
        let _ = caller;
        StatusCode::CREATED
    }
}

fn main() {
    let _ = Payments::create;
}
