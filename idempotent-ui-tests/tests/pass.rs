//! The handlers `#[idempotent]` must accept, each in a module of its own with its own
//! imports (a module sees nothing of its parent's, as a crate would), compiled and run
//! here: every case's `main` builds its router or calls its functions. The two cases that
//! must be crate roots (`renamed_crate`, `strict_lints`) are test targets of their own;
//! the mistakes the attribute must refuse are checked in `ui.rs`.

// Some cases are `pub` on purpose (a public handler keeps its visibility), which in a
// module of a test crate nothing outside can reach.
#![allow(unreachable_pub, missing_debug_implementations)]

#[path = "ui/pass/associated_fn.rs"]
mod associated_fn;

#[test]
fn associated_fn() {
    associated_fn::main();
}

#[path = "ui/pass/consumer.rs"]
mod consumer;

#[test]
fn consumer() {
    consumer::main();
}

#[path = "ui/pass/form.rs"]
mod form;

#[test]
fn form() {
    form::main();
}

#[path = "ui/pass/idempotency_key.rs"]
mod idempotency_key;

#[test]
fn idempotency_key() {
    idempotency_key::main();
}

#[path = "ui/pass/impl_into_response.rs"]
mod impl_into_response;

#[test]
fn impl_into_response() {
    impl_into_response::main();
}

#[path = "ui/pass/instrumented.rs"]
mod instrumented;

#[test]
fn instrumented() {
    instrumented::main();
}

#[path = "ui/pass/long_wait.rs"]
mod long_wait;

#[test]
fn long_wait() {
    long_wait::main();
}

#[path = "ui/pass/no_body.rs"]
mod no_body;

#[test]
fn no_body() {
    no_body::main();
}

#[path = "ui/pass/optional_key.rs"]
mod optional_key;

#[test]
fn optional_key() {
    optional_key::main();
}

#[path = "ui/pass/path_query.rs"]
mod path_query;

#[test]
fn path_query() {
    path_query::main();
}

#[path = "ui/pass/state_and_debug_handler.rs"]
mod state_and_debug_handler;

#[test]
fn state_and_debug_handler() {
    state_and_debug_handler::main();
}

#[path = "ui/pass/state_json_result.rs"]
mod state_json_result;

#[test]
fn state_json_result() {
    state_json_result::main();
}

#[path = "ui/pass/transaction.rs"]
mod transaction;

#[test]
fn transaction() {
    transaction::main();
}

#[path = "ui/pass/transaction_impl_into_response.rs"]
mod transaction_impl_into_response;

#[test]
fn transaction_impl_into_response() {
    transaction_impl_into_response::main();
}
