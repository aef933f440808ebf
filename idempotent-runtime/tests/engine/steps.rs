//! Recovery points through the engine's public API on the memory store: a retry resumes
//! after the steps an earlier execution recorded, and every misuse is a typed error,
//! never a silent rerun.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http_body_util::BodyExt;
use idempotent_runtime::engine::ResolveOutcome;
use idempotent_runtime::steps::Verified;
use idempotent_runtime::store::MemoryStore;
use idempotent_runtime::testing::faults::{Fault, Faulty, Operation};
use idempotent_runtime::{
    Fingerprint, HandlerConfig, Idempotency, IdempotencyKey, RecordState, StepError,
};

const CONFIG: HandlerConfig = HandlerConfig::new();
const SCOPE: &str = "acct_alice";

fn fingerprint(n: u8) -> Fingerprint {
    Fingerprint {
        version: 1,
        digest: [n; 32],
    }
}

async fn text(response: Response) -> (StatusCode, String) {
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, String::from_utf8(body.to_vec()).expect("utf-8"))
}

/// The `code` of a problem+json body.
fn problem_code(body: &str) -> String {
    let problem: serde_json::Value = serde_json::from_str(body).expect("a problem+json body");
    problem["code"].as_str().expect("a code").to_owned()
}

/// How many times each step of [`charge`] ran.
#[derive(Default)]
struct Runs {
    authorise: AtomicUsize,
    receipt: AtomicUsize,
    handler: AtomicUsize,
}

/// Authorise, then (on the first execution only, when `fail_first`) answer `502`, else
/// send the receipt and answer `201` with both outputs.
async fn charge(key: IdempotencyKey, runs: Arc<Runs>, fail_first: bool) -> Response {
    let execution = runs.handler.fetch_add(1, Ordering::SeqCst);
    let authorised = key
        .step("authorise", || async {
            let n = runs.authorise.fetch_add(1, Ordering::SeqCst) + 1;
            Ok::<_, StatusCode>(format!("auth_{n}"))
        })
        .await;
    let authorisation = match authorised {
        Ok(authorisation) => authorisation,
        Err(error) => return error.into_response(),
    };
    if fail_first && execution == 0 {
        return StatusCode::BAD_GATEWAY.into_response();
    }
    let sent = key
        .step("receipt", || async {
            runs.receipt.fetch_add(1, Ordering::SeqCst);
            Ok::<_, StatusCode>(true)
        })
        .await;
    match sent {
        Ok(sent) => (
            StatusCode::CREATED,
            format!("{authorisation} receipt={sent}"),
        )
            .into_response(),
        Err(error) => error.into_response(),
    }
}

async fn run_charge(engine: &Idempotency, key: &str, n: u8, runs: &Arc<Runs>) -> Response {
    let runs = runs.clone();
    engine
        .run(&CONFIG, SCOPE, key, fingerprint(n), move |key| {
            charge(key, runs, true)
        })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_5xx_resumes_after_its_recorded_steps() {
    let engine = Idempotency::new(MemoryStore::new());
    let runs = Arc::new(Runs::default());

    let (status, _) = text(run_charge(&engine, "k", 1, &runs).await).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    // The 5xx released the claim, but its step is kept: inspect shows it.
    let info = engine.inspect(SCOPE, "k").await.unwrap().expect("kept");
    assert!(matches!(
        info.state,
        RecordState::InProgress {
            holder_alive: false,
            ..
        }
    ));
    let names: Vec<_> = info.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["authorise"]);
    assert_eq!(&info.steps[0].output[..], br#""auth_1""#);

    // Another request under the key: the completed steps belong to the first one.
    let (status, _) = text(run_charge(&engine, "k", 2, &runs).await).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);

    // The same request resumes: authorise is not run again, its output comes back.
    let (status, body) = text(run_charge(&engine, "k", 1, &runs).await).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::CREATED, "auth_1 receipt=true")
    );
    assert_eq!(runs.authorise.load(Ordering::SeqCst), 1);
    assert_eq!(runs.receipt.load(Ordering::SeqCst), 1);
    assert_eq!(runs.handler.load(Ordering::SeqCst), 2);

    // Completed: replayed, and the steps gave way to the response.
    let replay = run_charge(&engine, "k", 1, &runs).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let (status, body) = text(replay).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::CREATED, "auth_1 receipt=true")
    );
    assert_eq!(runs.handler.load(Ordering::SeqCst), 2);
    let info = engine
        .inspect(SCOPE, "k")
        .await
        .unwrap()
        .expect("completed");
    assert!(info.steps.is_empty());
}

/// The fields (`message` included) of each event logged while a future runs with this
/// layer's subscriber.
#[derive(Clone, Default)]
struct Events(Arc<std::sync::Mutex<Vec<Fields>>>);

#[derive(Debug, Default)]
struct Fields(std::collections::BTreeMap<&'static str, String>);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name(), value.to_owned());
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Events {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        self.0.lock().unwrap().push(fields);
    }
}

/// The retry of a request that answered 5xx after a step takes over the record the
/// release kept for that step. Nothing lost a lease: the log must not send an operator
/// looking for a crashed instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_of_a_released_5xx_is_not_logged_as_a_lost_lease() {
    use tracing::instrument::WithSubscriber;
    use tracing_subscriber::layer::SubscriberExt;

    let engine = Idempotency::new(MemoryStore::new());
    let runs = Arc::new(Runs::default());
    let (status, _) = text(run_charge(&engine, "k", 1, &runs).await).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);

    let events = Events::default();
    let subscriber = tracing_subscriber::registry().with(events.clone());
    let retry = run_charge(&engine, "k", 1, &runs)
        .with_subscriber(subscriber)
        .await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    let events = events.0.lock().unwrap();
    let taken_over = events
        .iter()
        .find(|fields| fields.0.get("event").map(String::as_str) == Some("taken_over"))
        .unwrap_or_else(|| panic!("a taken_over event: {events:?}"));
    assert_ne!(
        taken_over.0.get("reason").map(String::as_str),
        Some("lease_lost"),
        "{taken_over:?}"
    );
    assert!(
        taken_over.0["message"].contains("released"),
        "the message names the release as one cause: {taken_over:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_that_fails_is_not_recorded_and_runs_again() {
    let engine = Idempotency::new(MemoryStore::new());
    let attempts = Arc::new(AtomicUsize::new(0));
    for expected in [StatusCode::SERVICE_UNAVAILABLE, StatusCode::CREATED] {
        let attempts = attempts.clone();
        let response = engine
            .run(&CONFIG, SCOPE, "k", fingerprint(1), move |key| async move {
                let result = key
                    .step("authorise", || async {
                        match attempts.fetch_add(1, Ordering::SeqCst) {
                            0 => Err(StatusCode::SERVICE_UNAVAILABLE),
                            n => Ok(n),
                        }
                    })
                    .await;
                match result {
                    Ok(n) => (StatusCode::CREATED, n.to_string()).into_response(),
                    Err(error) => error.into_response(),
                }
            })
            .await;
        assert_eq!(response.status(), expected);
    }
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misuse_is_a_typed_error_and_runs_nothing() {
    let engine = Idempotency::new(MemoryStore::new());
    let ran = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(std::sync::Mutex::new(Vec::new()));
    let response = {
        let (ran, errors) = (ran.clone(), errors.clone());
        engine
            .run(&CONFIG, SCOPE, "k", fingerprint(1), move |key| async move {
                let step = || async {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, StatusCode>(1u32)
                };
                key.step("a", step).await.expect("first use of the name");
                let mut seen = Vec::new();
                match key.step("a", step).await {
                    Err(StepError::NameUsedTwice { step }) => seen.push(step),
                    other => panic!("{other:?}"),
                }
                match key.step("", step).await {
                    Err(error @ StepError::InvalidName { .. }) => seen.push(error.to_string()),
                    other => panic!("{other:?}"),
                }
                let long = "n".repeat(idempotent_runtime::store::MAX_STEP_NAME + 1);
                match key.step(&long, step).await {
                    Err(StepError::InvalidName { .. }) => seen.push("long".into()),
                    other => panic!("{other:?}"),
                }
                errors.lock().unwrap().extend(seen);
                match key.step("a", step).await {
                    Err(error) => error.into_response(),
                    Ok(_) => unreachable!(),
                }
            })
            .await
    };
    assert_eq!(ran.load(Ordering::SeqCst), 1, "refused steps never run");
    assert_eq!(errors.lock().unwrap().len(), 3);
    let (status, body) = text(response).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        problem_code(&body),
        "step_failed",
        "nothing panicked: {body}"
    );

    // A key the engine did not hand out has no record to keep a step in.
    let key = IdempotencyKey::new(SCOPE.into(), "k".into());
    let outside = key.step("a", || async { Ok::<_, StatusCode>(1u32) }).await;
    assert!(
        matches!(outside, Err(StepError::NotClaimed { .. })),
        "{outside:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_output_that_no_longer_deserialises_is_refused_not_rerun() {
    let engine = Idempotency::new(MemoryStore::new());
    let ran = Arc::new(AtomicUsize::new(0));
    // The first execution records a number, then answers 500: released, step kept.
    let first = {
        let ran = ran.clone();
        engine
            .run(&CONFIG, SCOPE, "k", fingerprint(1), move |key| async move {
                key.step("quote", || async {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, StatusCode>(42u64)
                })
                .await
                .expect("recorded");
                StatusCode::INTERNAL_SERVER_ERROR
            })
            .await
    };
    assert_eq!(first.status(), StatusCode::INTERNAL_SERVER_ERROR);
    // The code changed: the retry asks for a string.
    let second = {
        let ran = ran.clone();
        engine
            .run(&CONFIG, SCOPE, "k", fingerprint(1), move |key| async move {
                match key
                    .step("quote", || async {
                        ran.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, StatusCode>(String::from("rerun"))
                    })
                    .await
                {
                    Err(error @ StepError::Undecodable { .. }) => {
                        assert!(error.to_string().contains("quote"), "{error}");
                        error.into_response()
                    }
                    other => panic!("{other:?}"),
                }
            })
            .await
    };
    assert_eq!(second.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(ran.load(Ordering::SeqCst), 1, "never rerun");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execution_that_lost_its_claim_records_nothing_and_runs_no_more_steps() {
    let engine = Idempotency::new(MemoryStore::new());
    let ran = Arc::new(AtomicUsize::new(0));
    let response = {
        let (engine, ran) = (engine.clone(), ran.clone());
        engine
            .clone()
            .run(&CONFIG, SCOPE, "k", fingerprint(1), move |key| async move {
                // An operator forces the key free while this execution runs.
                engine.forget(SCOPE, "k", true).await.expect("forget");
                let lost = key
                    .step("authorise", || async {
                        ran.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, StatusCode>(1u32)
                    })
                    .await;
                assert!(matches!(lost, Err(StepError::LeaseLost { .. })), "{lost:?}");
                assert!(key.lease_lost());
                let next = key
                    .step("receipt", || async {
                        ran.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, StatusCode>(1u32)
                    })
                    .await;
                match next {
                    Err(error @ StepError::LeaseLost { .. }) => error.into_response(),
                    other => panic!("{other:?}"),
                }
            })
            .await
    };
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "the second step never started"
    );
    let retry_after = response.headers().get("retry-after").cloned();
    let (status, body) = text(response).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("idempotency_lease_lost"), "{body}");
    assert!(retry_after.is_some());
    assert!(engine.inspect(SCOPE, "k").await.unwrap().is_none());
}

/// The layer hands the same key to the handler (`Extension<IdempotencyKey>`), so steps
/// resume behind it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_resume_behind_the_layer() {
    use axum::routing::post;
    use axum::{Extension, Router};
    use idempotent_runtime::IdempotencyLayer;
    use tower::ServiceExt;

    let engine = Idempotency::new(MemoryStore::new());
    let runs = Arc::new(Runs::default());
    let handler = {
        let runs = runs.clone();
        move |Extension(key): Extension<IdempotencyKey>| charge(key, runs.clone(), true)
    };
    let app = Router::new().route("/charges", post(handler)).layer(
        IdempotencyLayer::new(engine.clone())
            .scope_with(|_parts: &http::request::Parts| Some(SCOPE.to_owned())),
    );
    let request = || {
        http::Request::post("/charges")
            .header("idempotency-key", "layer-1")
            .body(axum::body::Body::from("{}"))
            .unwrap()
    };
    let first = app.clone().oneshot(request()).await.unwrap();
    assert_eq!(first.status(), StatusCode::BAD_GATEWAY);
    let (status, body) = text(app.clone().oneshot(request()).await.unwrap()).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::CREATED, "auth_1 receipt=true")
    );
    assert_eq!(runs.authorise.load(Ordering::SeqCst), 1);
    assert_eq!(runs.receipt.load(Ordering::SeqCst), 1);
}

/// A step whose output can never be recorded (over the stored-body cap) ran: its `500`
/// is recorded, whatever `on_server_error` says, so a retry replays it instead of running
/// the step again and failing the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_that_ran_but_cannot_be_recorded_is_not_run_again() {
    let engine = Idempotency::builder(MemoryStore::new())
        .max_stored_body(64)
        .build();
    let ran = Arc::new(AtomicUsize::new(0));
    for attempt in 0..2 {
        let ran = ran.clone();
        let response = engine
            .run(
                &CONFIG,
                SCOPE,
                "big",
                fingerprint(1),
                move |key| async move {
                    let output = key
                        .step("quote", || async {
                            ran.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, StatusCode>("x".repeat(1000))
                        })
                        .await;
                    match output {
                        Err(error @ StepError::TooLarge { .. }) => error.into_response(),
                        other => panic!("{other:?}"),
                    }
                },
            )
            .await;
        assert_eq!(
            response.headers().get("idempotent-replayed").is_some(),
            attempt == 1,
            "attempt {attempt}"
        );
        let (status, body) = text(response).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        // The replay carries the status only: this engine's cap, which refused the step's
        // output, refuses the problem's body too.
        if attempt == 0 {
            assert_eq!(
                problem_code(&body),
                "step_failed",
                "nothing panicked: {body}"
            );
        }
    }
    assert_eq!(ran.load(Ordering::SeqCst), 1, "the step ran once");
}

/// A store that refuses to record steps (an outage of that one call).
#[derive(Debug)]
struct StepsFail(MemoryStore);

#[async_trait::async_trait]
impl idempotent_runtime::store::Forward for StepsFail {
    fn inner(&self) -> &dyn idempotent_runtime::Store {
        &self.0
    }

    async fn record_step(
        &self,
        _: &str,
        _: &str,
        _: idempotent_runtime::store::FencingToken,
        _: &idempotent_runtime::store::RecordedStep,
    ) -> Result<bool, idempotent_runtime::StoreError> {
        Err(idempotent_runtime::StoreError::backend(
            "record_step refused",
        ))
    }
}

/// A step's `503` (the store failed to record it) gives the claim up even under
/// `OnServerError::Store`: recorded, it would be replayed for the whole TTL while saying
/// "retry".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_store_failure_releases_even_when_5xx_are_recorded() {
    let engine = Idempotency::new(StepsFail(MemoryStore::new()));
    let config = HandlerConfig::new().on_server_error(idempotent_runtime::OnServerError::Store);
    let ran = Arc::new(AtomicUsize::new(0));
    for _ in 0..2 {
        let ran = ran.clone();
        let response = engine
            .run(&config, SCOPE, "k", fingerprint(1), move |key| async move {
                let output = key
                    .step("authorise", || async {
                        ran.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, StatusCode>(1u32)
                    })
                    .await;
                match output {
                    Err(error @ StepError::Store { .. }) => error.into_response(),
                    other => panic!("{other:?}"),
                }
            })
            .await;
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(response.headers().get("idempotent-replayed").is_none());
    }
    assert_eq!(
        ran.load(Ordering::SeqCst),
        2,
        "released: the retry ran again"
    );
}

/// A handler's own error type that wraps a [`StepError`] with `?` and answers with a
/// response of its own (the `StepError`'s response, and anything it carries, is gone).
#[derive(Debug)]
enum AppError {
    Step(StepError<StatusCode>),
}

impl From<StepError<StatusCode>> for AppError {
    fn from(error: StepError<StatusCode>) -> Self {
        Self::Step(error)
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let Self::Step(error) = self;
        let status = match error {
            StepError::LeaseLost { .. } | StepError::Store { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        (status, format!(r#"{{"error":"{error}"}}"#)).into_response()
    }
}

/// The engine decides from the steps it ran, not from the response: a step that ran but
/// cannot be recorded records the handler's own `500` (default `on_server_error =
/// release`), so a retry replays it instead of running the step again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrecordable_step_wrapped_in_the_handlers_error_is_not_run_again() {
    let engine = Idempotency::builder(MemoryStore::new())
        .max_stored_body(64)
        .build();
    let ran = Arc::new(AtomicUsize::new(0));
    for attempt in 0..3 {
        let ran = ran.clone();
        let response = engine
            .run(
                &CONFIG,
                SCOPE,
                "big",
                fingerprint(1),
                move |key| async move {
                    let quote: String = key
                        .step("quote", || async {
                            ran.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, StatusCode>("x".repeat(1000))
                        })
                        .await?;
                    Ok::<_, AppError>((StatusCode::CREATED, quote))
                },
            )
            .await;
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            response.headers().get("idempotent-replayed").is_some(),
            attempt > 0,
            "attempt {attempt}"
        );
    }
    assert_eq!(ran.load(Ordering::SeqCst), 1, "the step ran once");
}

/// A step's store failure wrapped in the handler's own `503` gives the claim up even
/// under `OnServerError::Store`, so the retry runs (and is not answered the recorded
/// "retry" for the whole TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_store_failure_wrapped_in_the_handlers_error_releases_under_store() {
    let engine = Idempotency::new(StepsFail(MemoryStore::new()));
    let config = HandlerConfig::new().on_server_error(idempotent_runtime::OnServerError::Store);
    let ran = Arc::new(AtomicUsize::new(0));
    for _ in 0..2 {
        let ran = ran.clone();
        let response = engine
            .run(&config, SCOPE, "k", fingerprint(1), move |key| async move {
                let authorised: u32 = key
                    .step("authorise", || async {
                        ran.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, StatusCode>(1u32)
                    })
                    .await?;
                Ok::<_, AppError>((StatusCode::CREATED, authorised.to_string()))
            })
            .await;
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(response.headers().get("idempotent-replayed").is_none());
    }
    assert_eq!(
        ran.load(Ordering::SeqCst),
        2,
        "released: the retry ran again"
    );
}

/// A step whose own work failed gave nothing and recorded nothing: the handler may try it
/// again at once by the same name (an inline retry), and the output that finally comes is
/// recorded once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_step_can_be_retried_inline_by_the_same_name() {
    let engine = Idempotency::new(MemoryStore::new());
    let tries = Arc::new(AtomicUsize::new(0));
    let handler_tries = tries.clone();
    let response = engine
        .run(
            &CONFIG,
            SCOPE,
            "inline",
            fingerprint(1),
            move |key| async move {
                let mut last = None;
                for _ in 0..3 {
                    let tries = handler_tries.clone();
                    let quoted = key
                        .step("quote", || async move {
                            match tries.fetch_add(1, Ordering::SeqCst) {
                                0 => Err(StatusCode::BAD_GATEWAY),
                                n => Ok(format!("quote_{n}")),
                            }
                        })
                        .await;
                    match quoted {
                        Ok(quote) => return (StatusCode::CREATED, quote).into_response(),
                        Err(error @ StepError::Failed(_)) => last = Some(error),
                        Err(other) => return other.into_response(),
                    }
                }
                last.map_or(
                    StatusCode::INTERNAL_SERVER_ERROR.into_response(),
                    IntoResponse::into_response,
                )
            },
        )
        .await;
    assert_eq!(
        text(response).await,
        (StatusCode::CREATED, "quote_1".to_owned())
    );
    assert_eq!(
        tries.load(Ordering::SeqCst),
        2,
        "failed once, then gave its output"
    );
    let info = engine.inspect(SCOPE, "inline").await.expect("inspect");
    assert!(info.is_some(), "completed");
}

/// What an at-most-once `authorise` did: calls made, lookups made.
#[derive(Default)]
struct Calls {
    made: AtomicUsize,
    verified: AtomicUsize,
}

/// A handler whose `authorise` is at most once: `call` says what the call does on each
/// execution (by the count of calls made before it), `verify` what the lookup answers.
async fn authorise_at_most_once(
    key: IdempotencyKey,
    calls: Arc<Calls>,
    call: impl FnOnce(usize) -> Result<String, StatusCode>,
    verify: impl FnOnce(usize) -> Verified<String>,
) -> Response {
    let authorised = key
        .step_at_most_once(
            "authorise",
            || async {
                let made = calls.made.fetch_add(1, Ordering::SeqCst);
                call(made)
            },
            || async {
                calls.verified.fetch_add(1, Ordering::SeqCst);
                Ok(verify(calls.made.load(Ordering::SeqCst)))
            },
        )
        .await;
    match authorised {
        Ok(authorisation) => (StatusCode::CREATED, authorisation).into_response(),
        Err(error) => error.into_response(),
    }
}

/// The call answered, its output could not be recorded (the store failed), and the retry
/// finds the intent: it asks `verify`, which finds the call, and resumes with its output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_at_most_once_call_whose_output_was_lost_is_verified_not_repeated() {
    let faulty = Arc::new(Faulty::new(Arc::new(MemoryStore::new())));
    let engine = Idempotency::builder_shared(faulty.clone()).build();
    let calls = Arc::new(Calls::default());
    let run = |fail_record: bool| {
        let (faulty, calls) = (faulty.clone(), calls.clone());
        engine.run(&CONFIG, SCOPE, "amo-1", fingerprint(1), move |key| {
            authorise_at_most_once(
                key,
                calls,
                move |made| {
                    if fail_record {
                        faulty.inject(Operation::RecordStep, Fault::Fail);
                    }
                    Ok(format!("auth_{}", made + 1))
                },
                |made| Verified::Happened(format!("auth_{made}")),
            )
        })
    };
    let (status, body) = text(run(true).await).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let (status, body) = text(run(false).await).await;
    assert_eq!((status, body.as_str()), (StatusCode::CREATED, "auth_1"));
    assert_eq!(calls.made.load(Ordering::SeqCst), 1);
    assert_eq!(calls.verified.load(Ordering::SeqCst), 1);
    // Settled: a replay, nothing called or asked.
    let (status, body) = text(run(false).await).await;
    assert_eq!((status, body.as_str()), (StatusCode::CREATED, "auth_1"));
    assert_eq!(calls.verified.load(Ordering::SeqCst), 1);
}

/// The call failed (a timeout, say: its effect unknown), so the handler answered `502`;
/// the retry asks `verify`, which says it never happened, and calls again.
#[tokio::test]
async fn a_call_verify_says_never_happened_is_made_again() {
    let engine = Idempotency::new(MemoryStore::new());
    let calls = Arc::new(Calls::default());
    let run = || {
        let calls = calls.clone();
        engine.run(&CONFIG, SCOPE, "amo-2", fingerprint(1), move |key| {
            authorise_at_most_once(
                key,
                calls,
                |made| match made {
                    0 => Err(StatusCode::BAD_GATEWAY),
                    n => Ok(format!("auth_{}", n + 1)),
                },
                |_| Verified::NotHappened,
            )
        })
    };
    assert_eq!(text(run().await).await.0, StatusCode::BAD_GATEWAY);
    let (status, body) = text(run().await).await;
    assert_eq!((status, body.as_str()), (StatusCode::CREATED, "auth_2"));
    assert_eq!(calls.made.load(Ordering::SeqCst), 2);
    assert_eq!(calls.verified.load(Ordering::SeqCst), 1);
}

/// `verify` cannot tell: the step fails closed (`500` `step_outcome_unknown`), is never
/// called again, and the record names it; once an operator resolves it, the retry
/// resumes with the operator's output.
#[tokio::test]
async fn an_unknown_outcome_fails_closed_until_an_operator_resolves_it() {
    let faulty = Arc::new(Faulty::new(Arc::new(MemoryStore::new())));
    let engine = Idempotency::builder_shared(faulty.clone()).build();
    let calls = Arc::new(Calls::default());
    let run = || {
        let (faulty, calls) = (faulty.clone(), calls.clone());
        engine.run(&CONFIG, SCOPE, "amo-3", fingerprint(1), move |key| {
            authorise_at_most_once(
                key,
                calls,
                move |made| {
                    faulty.inject(Operation::RecordStep, Fault::Fail);
                    Ok(format!("auth_{}", made + 1))
                },
                |_| Verified::Unknown,
            )
        })
    };
    assert_eq!(text(run().await).await.0, StatusCode::SERVICE_UNAVAILABLE);
    for _ in 0..2 {
        let (status, body) = text(run().await).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(problem_code(&body), "step_outcome_unknown");
    }
    assert_eq!(
        calls.made.load(Ordering::SeqCst),
        1,
        "never called blindly again"
    );
    let info = engine.inspect(SCOPE, "amo-3").await.unwrap().unwrap();
    assert_eq!(info.unknown_outcomes(), vec!["authorise"]);

    let resolved = engine
        .resolve_step(
            SCOPE,
            "amo-3",
            "authorise",
            &serde_json::json!("auth_checked"),
        )
        .await
        .unwrap();
    assert_eq!(resolved, ResolveOutcome::Resolved);
    let again = engine
        .resolve_step(SCOPE, "amo-3", "authorise", &serde_json::json!("other"))
        .await
        .unwrap();
    assert_eq!(again, ResolveOutcome::NothingToResolve);
    let (status, body) = text(run().await).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::CREATED, "auth_checked")
    );
    assert_eq!(calls.made.load(Ordering::SeqCst), 1);
    assert_eq!(calls.verified.load(Ordering::SeqCst), 2);
}

/// No intent, no call: when the intent cannot be recorded the step is not called, and
/// the retry (which finds no intent) calls it without asking.
#[tokio::test]
async fn no_call_is_made_without_its_intent_recorded() {
    let faulty = Arc::new(Faulty::new(Arc::new(MemoryStore::new())));
    let engine = Idempotency::builder_shared(faulty.clone()).build();
    let calls = Arc::new(Calls::default());
    let run = || {
        let calls = calls.clone();
        engine.run(&CONFIG, SCOPE, "amo-4", fingerprint(1), move |key| {
            authorise_at_most_once(
                key,
                calls,
                |made| Ok(format!("auth_{}", made + 1)),
                |_| Verified::Unknown,
            )
        })
    };
    faulty.inject(Operation::RecordStep, Fault::Fail);
    assert_eq!(text(run().await).await.0, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(calls.made.load(Ordering::SeqCst), 0);
    let (status, body) = text(run().await).await;
    assert_eq!((status, body.as_str()), (StatusCode::CREATED, "auth_1"));
    assert_eq!(calls.verified.load(Ordering::SeqCst), 0);
}

/// Without the intent record (what `key.step` does), the same lost output makes the
/// retry call again: the check above is what makes the difference.
#[tokio::test]
async fn an_at_least_once_step_whose_output_was_lost_is_called_again() {
    let faulty = Arc::new(Faulty::new(Arc::new(MemoryStore::new())));
    let engine = Idempotency::builder_shared(faulty.clone()).build();
    let calls = Arc::new(AtomicUsize::new(0));
    let run = |fail_record: bool| {
        let (faulty, calls) = (faulty.clone(), calls.clone());
        engine.run(
            &CONFIG,
            SCOPE,
            "alo-1",
            fingerprint(1),
            move |key| async move {
                let authorised = key
                    .step("authorise", || async {
                        if fail_record {
                            faulty.inject(Operation::RecordStep, Fault::Fail);
                        }
                        Ok::<_, StatusCode>(calls.fetch_add(1, Ordering::SeqCst) + 1)
                    })
                    .await;
                match authorised {
                    Ok(n) => (StatusCode::CREATED, format!("auth_{n}")).into_response(),
                    Err(error) => error.into_response(),
                }
            },
        )
    };
    assert_eq!(
        text(run(true).await).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(text(run(false).await).await.1, "auth_2");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// The call failed (its effect unknown) and the handler retries the step inline: the
/// retry asks `verify` before calling again, as a later execution would.
#[tokio::test]
async fn an_inline_retry_of_an_at_most_once_step_verifies_first() {
    let engine = Idempotency::new(MemoryStore::new());
    let (calls, verified) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (c, v) = (calls.clone(), verified.clone());
    let response = engine
        .run(
            &CONFIG,
            SCOPE,
            "amo-5",
            fingerprint(1),
            move |key| async move {
                for _ in 0..2 {
                    let charged = key
                        .step_at_most_once(
                            "authorise",
                            || async {
                                c.fetch_add(1, Ordering::SeqCst);
                                Err::<String, _>(StatusCode::GATEWAY_TIMEOUT)
                            },
                            || async {
                                v.fetch_add(1, Ordering::SeqCst);
                                Ok(Verified::Happened("auth_1".to_owned()))
                            },
                        )
                        .await;
                    if let Ok(authorisation) = charged {
                        return (StatusCode::CREATED, authorisation).into_response();
                    }
                }
                StatusCode::BAD_GATEWAY.into_response()
            },
        )
        .await;
    let (status, body) = text(response).await;
    assert_eq!((status, body.as_str()), (StatusCode::CREATED, "auth_1"));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the retry did not call again"
    );
    assert_eq!(verified.load(Ordering::SeqCst), 1);
}
