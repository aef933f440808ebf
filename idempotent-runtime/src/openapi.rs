//! The published policy in OpenAPI (feature `utoipa`): what a client of an idempotent
//! operation must send and may get back, written into the operation of a `utoipa`
//! document from the policy the handler really runs with.
//!
//! The IETF draft (`draft-ietf-httpapi-idempotency-key-header`) asks a resource to
//! publish its idempotency policy. [`PublishedPolicy`] adds to each operation it names:
//!
//! - the `Idempotency-Key` header parameter (the engine's
//!   [`header_name`](crate::engine::IdempotencyBuilder::header_name)), required or optional
//!   (`key = optional`): 1 to 255 characters, bare or quoted, with a `pattern` that
//!   accepts exactly what the engine accepts;
//! - every answer the library itself can give on the operation, as
//!   `application/problem+json` with the shared [`Problem`] schema component and its
//!   [`codes`]: `400` (key missing or malformed, body unreadable), `409` (with
//!   `Retry-After`), `413` (body over the `DefaultBodyLimit`), `422` (key reused), `500`
//!   (handler panicked, interrupted at its maximum duration, misconfigured) and `503`
//!   (store unreachable, with `Retry-After`). A response the operation documents already,
//!   such as its own `400`, keeps its content and gains the problem codes in its
//!   description. An engine that renders these answers in the application's own error
//!   envelope ([`IdempotencyBuilder::render_problems`](crate::IdempotencyBuilder::render_problems))
//!   has them described with the envelope's schema instead, through
//!   [`PublishedPolicy::problem_content`];
//! - the `Idempotent-Replayed` header on the operation's own responses (those that are
//!   stored and replayed: all of them, except 5xx unless `on_server_error = store`) and on
//!   the `500` (an interrupted request's answer is recorded and replayed);
//! - the policy: an `x-idempotency` extension object (TTL, lease, maximum duration, how
//!   long a duplicate waits for the running original, fingerprint mode, what a 5xx does,
//!   whether the key is required) and the same in a paragraph appended to the operation's
//!   description.
//!
//! The values come from the handler's [`HandlerConfig`] (name it with
//! `#[idempotent(policy = NAME)]`, or read it from
//! [`IdempotencyLayer::policy`](crate::layer::IdempotencyLayer::policy)) and, for what it leaves
//! to the engine, from the [`Idempotency`] engine itself:
//!
//! ```
//! use std::time::Duration;
//!
//! use http::Method;
//! use idempotent_runtime::openapi::PublishedPolicy;
//! use idempotent_runtime::store::MemoryStore;
//! use idempotent_runtime::{HandlerConfig, Idempotency};
//! use utoipa::openapi::path::{HttpMethod, OperationBuilder, PathItem};
//! use utoipa::openapi::{OpenApiBuilder, PathsBuilder};
//!
//! // In an app: `#[idempotent(scope = caller, ttl = "2h", policy = CREATE_ORDER)]`.
//! const CREATE_ORDER: HandlerConfig = HandlerConfig::new().ttl(Duration::from_secs(7200));
//!
//! let engine = Idempotency::new(MemoryStore::new());
//! // Usually `#[derive(OpenApi)]` with `#[utoipa::path]` handlers; built by hand here.
//! let mut doc = OpenApiBuilder::new()
//!     .paths(PathsBuilder::new().path(
//!         "/orders",
//!         PathItem::new(HttpMethod::Post, OperationBuilder::new().build()),
//!     ))
//!     .build();
//! PublishedPolicy::new(&engine)
//!     .operation(Method::POST, "/orders", CREATE_ORDER)
//!     .apply(&mut doc)
//!     .expect("POST /orders is in the document");
//!
//! let json = serde_json::to_value(&doc).unwrap();
//! let post = &json["paths"]["/orders"]["post"];
//! assert_eq!(post["parameters"][0]["name"], "Idempotency-Key");
//! assert_eq!(post["parameters"][0]["required"], true);
//! assert_eq!(post["x-idempotency"]["ttl_seconds"], 7200);
//! assert_eq!(post["x-idempotency"]["lease_seconds"], 30); // the engine's default
//! assert!(post["responses"]["409"]["headers"]["Retry-After"].is_object());
//! ```

use std::borrow::Cow;
use std::fmt::Write as _;
use std::time::Duration;

use http::Method;
use utoipa::openapi::content::ContentBuilder;
use utoipa::openapi::header::{Header, HeaderBuilder};
use utoipa::openapi::path::{Operation, ParameterBuilder, ParameterIn, PathItem};
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::{Components, OpenApi, Ref, RefOr, Required};
use utoipa::{Modify, PartialSchema, ToSchema};

use crate::config::{HandlerConfig, OnServerError};
use crate::engine::{Idempotency, REPLAYED_HEADER};
use crate::fingerprint::FingerprintMode;
use crate::key::MAX_KEY_LEN;
use crate::problem::{PROBLEM_JSON, Problem, codes};

/// The name of the operation extension holding the policy.
pub const EXTENSION: &str = "x-idempotency";

/// The idempotency policy of some operations, to write into an OpenAPI document with
/// [`apply`](Self::apply) (or as a `utoipa` [`Modify`]). See the [module docs](self).
#[derive(Debug, Clone)]
pub struct PublishedPolicy {
    engine: Idempotency,
    operations: Vec<Protected>,
    problems: ProblemContent,
}

/// How the library's own answers are described: their media type and schema component.
#[derive(Debug, Clone)]
struct ProblemContent {
    media_type: String,
    /// The schema component's name; `None`: the [`Problem`] component, added by `apply`.
    schema: Option<String>,
}

impl ProblemContent {
    /// The schema component's name.
    fn schema_name(&self) -> Cow<'_, str> {
        match &self.schema {
            Some(name) => Cow::Borrowed(name),
            None => Problem::name(),
        }
    }
}

/// One operation and the policy it runs with.
#[derive(Debug, Clone)]
struct Protected {
    method: Method,
    path: String,
    config: HandlerConfig,
}

/// An operation named to [`PublishedPolicy::operation`] that the document does not have:
/// its policy would go unpublished, so nothing is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the OpenAPI document has no operation {method} {path} to publish its idempotency policy \
     on (paths are written as in the document, e.g. `/payments/{{id}}`)"
)]
pub struct OperationNotFound {
    /// The method named.
    pub method: Method,
    /// The path named.
    pub path: String,
}

impl PublishedPolicy {
    /// No operations yet; what a handler leaves to the engine (TTL, lease, maximum
    /// duration, the key header's name) is read from `engine`.
    pub fn new(engine: &Idempotency) -> Self {
        Self {
            engine: engine.clone(),
            operations: Vec::new(),
            problems: ProblemContent {
                media_type: PROBLEM_JSON.to_owned(),
                schema: None,
            },
        }
    }

    /// Describes the library's own answers in the application's error envelope rather
    /// than as problem+json: as `media_type` (e.g. `application/json`) with the schema
    /// component named `schema` — for an engine that renders them so
    /// ([`IdempotencyBuilder::render_problems`](crate::IdempotencyBuilder::render_problems)).
    /// The document holds that component already (e.g. the envelope's
    /// `#[derive(ToSchema)]` listed in `components(schemas(…))`); the [`Problem`]
    /// component is then not added.
    pub fn problem_content(
        mut self,
        media_type: impl Into<String>,
        schema: impl Into<String>,
    ) -> Self {
        self.problems = ProblemContent {
            media_type: media_type.into(),
            schema: Some(schema.into()),
        };
        self
    }

    /// Adds the operation `method` `path` (as the document spells it, e.g.
    /// `/payments/{id}`), protected with `config`.
    pub fn operation(
        mut self,
        method: Method,
        path: impl Into<String>,
        config: HandlerConfig,
    ) -> Self {
        self.operations.push(Protected {
            method,
            path: path.into(),
            config,
        });
        self
    }

    /// Writes the policy into `doc`: every named operation gains the key parameter, the
    /// problem responses, the `Idempotent-Replayed` header and the policy (see the
    /// [module docs](self)); the [`Problem`] schema joins the components unless one of
    /// that name is there already (or the answers are described in the application's
    /// own envelope, [`problem_content`](Self::problem_content)). An operation that carries an [`EXTENSION`] already is
    /// left as it is: applying twice is applying once.
    ///
    /// # Errors
    ///
    /// When an operation is missing from `doc`; `doc` is then left unchanged.
    pub fn apply(&self, doc: &mut OpenApi) -> Result<(), OperationNotFound> {
        for protected in &self.operations {
            if operation_mut(doc, &protected.method, &protected.path).is_none() {
                return Err(OperationNotFound {
                    method: protected.method.clone(),
                    path: protected.path.clone(),
                });
            }
        }
        if self.problems.schema.is_none() {
            let components = doc.components.get_or_insert_with(Components::new);
            components
                .schemas
                .entry(Problem::name().into_owned())
                .or_insert_with(Problem::schema);
        }
        for protected in &self.operations {
            let policy = self.effective(&protected.config);
            let operation =
                operation_mut(doc, &protected.method, &protected.path).expect("checked above");
            policy.document(operation);
        }
        Ok(())
    }

    /// The policy a handler with `config` runs with on this engine.
    fn effective(&self, config: &HandlerConfig) -> Effective {
        Effective {
            header: display_header_name(self.engine.header_name().as_str()),
            key_optional: config.key_optional,
            ttl: self.engine.ttl_for(config),
            lease: self.engine.lease_for(config),
            max_duration: self.engine.max_duration_for(config),
            wait: self.engine.wait_for(config),
            fingerprint: config.fingerprint,
            on_server_error: config.on_server_error,
            problems: self.problems.clone(),
        }
    }
}

/// `utoipa`'s hook, for `#[openapi(modifiers(...))]` or `Modify::modify`.
///
/// # Panics
///
/// When an operation is missing from the document ([`OperationNotFound`]): a protected
/// operation must not go unpublished. Call [`PublishedPolicy::apply`] to handle it.
impl Modify for PublishedPolicy {
    fn modify(&self, openapi: &mut OpenApi) {
        if let Err(err) = self.apply(openapi) {
            panic!("{err}");
        }
    }
}

/// The operation `method` `path` of `doc`, if there is one.
fn operation_mut<'a>(
    doc: &'a mut OpenApi,
    method: &Method,
    path: &str,
) -> Option<&'a mut Operation> {
    let item: &mut PathItem = doc.paths.paths.get_mut(path)?;
    let slot = match *method {
        Method::GET => &mut item.get,
        Method::PUT => &mut item.put,
        Method::POST => &mut item.post,
        Method::DELETE => &mut item.delete,
        Method::OPTIONS => &mut item.options,
        Method::HEAD => &mut item.head,
        Method::PATCH => &mut item.patch,
        Method::TRACE => &mut item.trace,
        _ => return None,
    };
    slot.as_mut()
}

/// `idempotency-key` → `Idempotency-Key` (header names are case-insensitive; this is how
/// the draft and most documentation write them).
fn display_header_name(name: &str) -> String {
    name.split('-')
        .map(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .map(|first| first.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join("-")
}

/// The policy of one operation, every default resolved.
struct Effective {
    header: String,
    key_optional: bool,
    ttl: Duration,
    lease: Duration,
    max_duration: Duration,
    /// How long a duplicate waits for the running original (`None`: `409` at once).
    wait: Option<Duration>,
    fingerprint: FingerprintMode,
    on_server_error: OnServerError,
    problems: ProblemContent,
}

impl Effective {
    fn document(&self, operation: &mut Operation) {
        // Documented already (this policy applied twice, or another first): left as it is,
        // so that our own answers are never mistaken for the operation's.
        if operation
            .extensions
            .as_ref()
            .is_some_and(|extensions| extensions.contains_key(EXTENSION))
        {
            return;
        }
        // The operation's own responses are what gets replayed; ours (added below) never are.
        let replayed_header = self.replayed_header();
        for (status, response) in &mut operation.responses.responses {
            if let RefOr::T(response) = response
                && self.replayable(status)
            {
                response.headers.insert(
                    display_header_name(REPLAYED_HEADER),
                    replayed_header.clone(),
                );
            }
        }
        let parameters = operation.parameters.get_or_insert_with(Vec::new);
        parameters.retain(|parameter| {
            !(parameter.parameter_in == ParameterIn::Header
                && parameter.name.eq_ignore_ascii_case(&self.header))
        });
        parameters.push(self.key_parameter());
        self.add_problem(operation, "400", &self.bad_key(), false);
        self.add_problem(
            operation,
            "409",
            &format!(
                "A request with this `{}` is still running (`{}`): retry with the same key after \
                 `Retry-After` seconds.",
                self.header,
                codes::IN_PROGRESS
            ),
            true,
        );
        self.add_problem(
            operation,
            "413",
            &format!(
                "The request body is larger than the server accepts (`{}`: axum's \
                 `DefaultBodyLimit`, 2 MiB unless the server sets another); nothing ran and \
                 the key is not used.",
                codes::PAYLOAD_TOO_LARGE
            ),
            false,
        );
        self.add_problem(
            operation,
            "422",
            &format!(
                "This `{}` was used with another request (`{}`): a new request needs a new key.",
                self.header,
                codes::KEY_REUSED
            ),
            false,
        );
        self.add_problem(
            operation,
            "500",
            &format!(
                "The idempotency layer failed the request: the handler panicked (`{}`; \
                 nothing is recorded, a retry with the same key runs it), it ran past its \
                 {} maximum duration and was interrupted (`{}`; recorded and replayed, \
                 since it may have taken effect), a step of the handler could not be run \
                 or its result kept (`{}`), or the server is misconfigured (`{}`, \
                 `{}`, `{}`) or a transactional handler's transaction was rolled back \
                 (`{}`).",
                codes::HANDLER_PANICKED,
                human(self.max_duration),
                codes::INTERRUPTED,
                codes::STEP_FAILED,
                codes::SCOPE_EMPTY,
                codes::SCOPE_MISSING,
                codes::TRANSACTION_UNSUPPORTED,
                codes::TRANSACTION_ABORTED,
            ),
            false,
        );
        // The interrupted answer is recorded, so it is replayed whatever `on_server_error`
        // says (that option is about the handler's own 5xx).
        if let Some(RefOr::T(response)) = operation.responses.responses.get_mut("500") {
            response
                .headers
                .entry(display_header_name(REPLAYED_HEADER))
                .or_insert(replayed_header);
        }
        self.add_problem(
            operation,
            "503",
            &format!(
                "The idempotency key could not be checked (`{}`); nothing ran: retry with the \
                 same key after `Retry-After` seconds. A multi-step handler may also answer \
                 `{}` (its execution lost the key's lease at a step) or `{}` (a step could \
                 not be recorded): the completed steps are kept, and a retry with the same \
                 key resumes after them.",
                codes::STORE_UNAVAILABLE,
                codes::LEASE_LOST,
                codes::STORE_UNAVAILABLE
            ),
            true,
        );
        let description = operation.description.get_or_insert_with(String::new);
        if !description.is_empty() {
            description.push_str("\n\n");
        }
        description.push_str(&self.prose());
        operation
            .extensions
            .get_or_insert_with(Default::default)
            .insert(EXTENSION.to_owned(), self.extension());
    }

    /// Whether an answer with `status` ("201", "4XX", "default") is stored and replayed.
    fn replayable(&self, status: &str) -> bool {
        !status.starts_with('5') || self.on_server_error == OnServerError::Store
    }

    fn key_parameter(&self) -> utoipa::openapi::path::Parameter {
        let required = if self.key_optional {
            Required::False
        } else {
            Required::True
        };
        ParameterBuilder::new()
            .name(&self.header)
            .parameter_in(ParameterIn::Header)
            .required(required)
            .description(Some(format!(
                "Names this operation so that a retry is recognised: 1 to {MAX_KEY_LEN} printable \
                 ASCII characters (e.g. a UUID), bare (without spaces, `,`, `;` or `\"`) or as \
                 an RFC 9651 string (`\"a b\"`, with `\\\"` and `\\\\` the only escapes; \
                 `\"abc\"` and `abc` are the same key). Keys are unique per caller. Send a new \
                 key for each new operation and the same key on every retry of it.{}",
                if self.key_optional {
                    " Optional: a request without it runs unprotected (never replayed)."
                } else {
                    ""
                }
            )))
            .schema(Some(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .pattern(Some(key_pattern()))
                    .examples(["8e03978e-40d5-43e8-bc93-6894a57f9324"]),
            ))
            .build()
    }

    fn bad_key(&self) -> String {
        if self.key_optional {
            format!(
                "The `{}` header is malformed (`{}`; `reason` says how), or the body could \
                 not be read (`{}`).",
                self.header,
                codes::KEY_INVALID,
                codes::BAD_REQUEST
            )
        } else {
            format!(
                "The `{}` header is missing (`{}`) or malformed (`{}`; `reason` says how), \
                 or the body could not be read (`{}`).",
                self.header,
                codes::KEY_MISSING,
                codes::KEY_INVALID,
                codes::BAD_REQUEST
            )
        }
    }

    fn replayed_header(&self) -> Header {
        HeaderBuilder::new()
            .schema(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(["true"])),
            )
            .description(Some(
                "`true` on a replay: the operation ran earlier under this idempotency key and \
                 this is its recorded answer. Absent on the original answer. A replay whose \
                 body was not kept (over the store's size cap) has the original status and \
                 headers and a problem document (`idempotency_response_not_stored`) for body.",
            ))
            .build()
    }

    /// Adds (or completes) the problem response `status`.
    fn add_problem(
        &self,
        operation: &mut Operation,
        status: &str,
        description: &str,
        retry_after: bool,
    ) {
        let responses = &mut operation.responses.responses;
        let response = responses
            .entry(status.to_owned())
            .or_insert_with(|| RefOr::T(ResponseBuilder::new().build()));
        // A shared response component belongs to other operations too: left as it is.
        let RefOr::T(response) = response else {
            return;
        };
        add_sentence(&mut response.description, description);
        response
            .content
            .entry(self.problems.media_type.clone())
            .or_insert_with(|| {
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name(self.problems.schema_name())))
                    .build()
            });
        if retry_after {
            response
                .headers
                .entry("Retry-After".to_owned())
                .or_insert_with(retry_after_header);
        }
    }

    /// The policy in words, for the operation's description.
    fn prose(&self) -> String {
        let mut text = format!("**Idempotency.** Send an `{}` header", self.header);
        if self.key_optional {
            text.push_str(
                " (optional: a request without one runs unprotected and is never replayed)",
            );
        } else {
            text.push_str(" (required)");
        }
        let _ = write!(
            text,
            " and the same key on every retry. A key is remembered for {ttl}: a retry with the \
             same key and the same request ({fingerprint}) gets the first answer again, with \
             `Idempotent-Replayed: true`, and the operation does not run twice; the same key with \
             another request is `422`. {in_flight} A request that stops (a crash) frees its key within its {lease} \
             lease, and one still running after {max} is interrupted. {server_error} If the key \
             cannot be checked the answer is `503` and nothing runs.",
            ttl = human(self.ttl),
            in_flight = match self.wait {
                Some(wait) => format!(
                    "A retry while the first request still runs waits up to {} for its answer, \
                     then gets `409` with `Retry-After` if it is still running.",
                    human(wait)
                ),
                None => "A retry while the first request still runs is `409` with `Retry-After`."
                    .to_owned(),
            },
            lease = human(self.lease),
            max = human(self.max_duration),
            fingerprint = match self.fingerprint {
                FingerprintMode::Json => {
                    "method, path, query and JSON body, whose key order and whitespace do not \
                     matter"
                }
                _ => "method, path, query and body bytes",
            },
            server_error = match self.on_server_error {
                OnServerError::Store => "A 5xx answer is stored and replayed like any other.",
                _ =>
                    "A 5xx answer is not stored: a retry with the same key runs the operation again.",
            },
        );
        text
    }

    /// The policy as data, for the `x-idempotency` extension.
    fn extension(&self) -> serde_json::Value {
        serde_json::json!({
            "header": self.header,
            "key": if self.key_optional { "optional" } else { "required" },
            "ttl_seconds": seconds(self.ttl),
            "lease_seconds": seconds(self.lease),
            "max_duration_seconds": seconds(self.max_duration),
            "wait_seconds": self.wait.map(seconds),
            "fingerprint": match self.fingerprint {
                FingerprintMode::Json => "json",
                _ => "raw",
            },
            "on_server_error": match self.on_server_error {
                OnServerError::Store => "store",
                _ => "release",
            },
            "replayed_header": display_header_name(REPLAYED_HEADER),
        })
    }
}

/// The key header's value as [`parse_header`](crate::key::parse_header) accepts it: a bare
/// key (visible ASCII but `"`, `,` and `;`) or an RFC 9651 string (printable ASCII, `\"`
/// and `\\` the only escapes, not all spaces), of 1 to [`MAX_KEY_LEN`] characters once
/// unquoted. A `pattern` rather than `maxLength`: `maxLength` would count the quotes and
/// escapes, and so refuse quoted keys the engine accepts.
fn key_pattern() -> String {
    format!(
        r#"^(?:[!#-+\-./0-:<-~]{{1,{MAX_KEY_LEN}}}|"(?! *")(?:[ !#-\[\]-~]|\\["\\]){{1,{MAX_KEY_LEN}}}")$"#
    )
}

fn retry_after_header() -> Header {
    HeaderBuilder::new()
        .schema(
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(1)),
        )
        .description(Some("Seconds to wait before retrying with the same key."))
        .build()
}

/// Appends `sentence` to a response description (once).
fn add_sentence(description: &mut String, sentence: &str) {
    if description.contains(sentence) {
        return;
    }
    if !description.is_empty() {
        description.push(' ');
    }
    description.push_str(sentence);
}

/// Seconds as a JSON number: an integer when whole (`86400`), else a fraction (`1.5`).
fn seconds(duration: Duration) -> serde_json::Value {
    if duration.subsec_nanos() == 0 {
        duration.as_secs().into()
    } else {
        duration.as_secs_f64().into()
    }
}

/// `86400s` → `24h`, `90s` → `1m 30s`, `1.5s` → `1s 500ms` (to the millisecond).
fn human(duration: Duration) -> String {
    let secs = duration.as_secs();
    let units = [
        (secs / 3600, "h"),
        (secs / 60 % 60, "m"),
        (secs % 60, "s"),
        (u64::from(duration.subsec_millis()), "ms"),
    ];
    let parts: Vec<String> = units
        .iter()
        .filter(|(value, _)| *value > 0)
        .map(|(value, unit)| format!("{value}{unit}"))
        .collect();
    if parts.is_empty() {
        "0s".to_owned()
    } else {
        parts.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;
    use utoipa::openapi::path::{HttpMethod, OperationBuilder};
    use utoipa::openapi::{OpenApiBuilder, PathsBuilder};

    use super::*;
    use crate::store::MemoryStore;

    /// A document with `POST /orders` (documenting its own `201` and `400`, and a `500`)
    /// and `GET /orders`.
    fn document() -> OpenApi {
        let post = OperationBuilder::new()
            .description(Some("Creates an order."))
            .response("201", ResponseBuilder::new().description("Created"))
            .response(
                "400",
                ResponseBuilder::new()
                    .description("Invalid order.")
                    .content("application/json", ContentBuilder::new().build()),
            )
            .response("500", ResponseBuilder::new().description("Broken"))
            .build();
        let get = OperationBuilder::new()
            .response("200", ResponseBuilder::new().description("The orders"))
            .build();
        let mut item = PathItem::new(HttpMethod::Post, post);
        item.get = Some(get);
        OpenApiBuilder::new()
            .paths(PathsBuilder::new().path("/orders", item))
            .build()
    }

    fn published(engine: &Idempotency, config: HandlerConfig) -> Value {
        let mut doc = document();
        PublishedPolicy::new(engine)
            .operation(Method::POST, "/orders", config)
            .apply(&mut doc)
            .unwrap();
        serde_json::to_value(&doc).unwrap()
    }

    /// An application that renders the library's answers in its own envelope describes
    /// them with its schema: no problem+json, and no `Problem` component.
    #[test]
    fn the_library_answers_in_the_applications_envelope() {
        let engine = Idempotency::new(MemoryStore::new());
        let mut doc = document();
        PublishedPolicy::new(&engine)
            .problem_content("application/json", "ErrorEnvelope")
            .operation(Method::POST, "/orders", HandlerConfig::new())
            .apply(&mut doc)
            .unwrap();
        let doc = serde_json::to_value(&doc).unwrap();
        let responses = &doc["paths"]["/orders"]["post"]["responses"];
        for status in ["409", "413", "422", "500", "503"] {
            let content = &responses[status]["content"];
            assert_eq!(
                content["application/json"]["schema"]["$ref"], "#/components/schemas/ErrorEnvelope",
                "{status}"
            );
            assert!(content.get(PROBLEM_JSON).is_none(), "{status}");
        }
        assert!(
            responses["409"]["headers"]["Retry-After"].is_object(),
            "the headers stay the engine's"
        );
        assert!(
            doc["components"]["schemas"].get("Problem").is_none(),
            "{doc}"
        );
    }

    #[test]
    fn a_required_key_with_the_engine_defaults() {
        let engine = Idempotency::new(MemoryStore::new());
        let doc = published(&engine, HandlerConfig::new());
        let post = &doc["paths"]["/orders"]["post"];
        let parameters = post["parameters"].as_array().unwrap();
        assert_eq!(parameters.len(), 1);
        let key = &parameters[0];
        assert_eq!(key["name"], "Idempotency-Key");
        assert_eq!(key["in"], "header");
        assert_eq!(key["required"], true);
        assert_eq!(key["schema"]["type"], "string");
        assert_eq!(key["schema"]["pattern"], key_pattern());

        let policy = &post[EXTENSION];
        assert_eq!(policy["key"], "required");
        assert_eq!(policy["ttl_seconds"], 24 * 3600);
        assert_eq!(policy["lease_seconds"], 30);
        assert_eq!(policy["max_duration_seconds"], 300);
        assert_eq!(policy["fingerprint"], "raw");
        assert_eq!(policy["on_server_error"], "release");
        assert_eq!(policy["wait_seconds"], Value::Null);
        let description = post["description"].as_str().unwrap();
        assert!(
            description.contains("still runs is `409` with `Retry-After`"),
            "{description}"
        );
        assert!(
            description.starts_with("Creates an order.\n\n**Idempotency.**"),
            "{description}"
        );
        assert!(description.contains("(required)"), "{description}");
        assert!(description.contains("remembered for 24h"), "{description}");
        assert!(
            description.contains("within its 30s lease"),
            "{description}"
        );
        assert!(
            description.contains("runs the operation again"),
            "{description}"
        );

        let responses = &post["responses"];
        for (status, code) in [
            ("400", codes::KEY_MISSING),
            ("400", codes::KEY_INVALID),
            ("400", codes::BAD_REQUEST),
            ("409", codes::IN_PROGRESS),
            ("413", codes::PAYLOAD_TOO_LARGE),
            ("422", codes::KEY_REUSED),
            ("500", codes::HANDLER_PANICKED),
            ("500", codes::INTERRUPTED),
            ("500", codes::STEP_FAILED),
            ("500", codes::SCOPE_EMPTY),
            ("500", codes::SCOPE_MISSING),
            ("500", codes::TRANSACTION_UNSUPPORTED),
            ("500", codes::TRANSACTION_ABORTED),
            ("503", codes::STORE_UNAVAILABLE),
            ("503", codes::LEASE_LOST),
        ] {
            let response = &responses[status];
            assert_eq!(
                response["content"][PROBLEM_JSON]["schema"]["$ref"], "#/components/schemas/Problem",
                "{status}"
            );
            let description = response["description"].as_str().unwrap();
            assert!(description.contains(code), "{status} {code}: {description}");
            // Ours are never replayed, except the interrupted `500` (the document's own
            // `400` is, below).
            assert_eq!(
                response["headers"].get("Idempotent-Replayed").is_none(),
                status != "400" && status != "500",
                "{status}"
            );
        }
        assert!(
            responses["500"]["description"]
                .as_str()
                .unwrap()
                .contains("its 5m maximum duration"),
            "{}",
            responses["500"]
        );
        for status in ["409", "503"] {
            assert_eq!(
                responses[status]["headers"]["Retry-After"]["schema"]["type"],
                "integer"
            );
        }
        // The operation's own 400 keeps its content and says both.
        assert!(responses["400"]["content"]["application/json"].is_object());
        let bad = responses["400"]["description"].as_str().unwrap();
        assert!(
            bad.starts_with("Invalid order. The `Idempotency-Key` header is missing"),
            "{bad}"
        );
        // Its own answers are replayed, except the 5xx (released); its `500` still says
        // `Idempotent-Replayed`, for the library's interrupted answer (recorded).
        assert_eq!(
            responses["201"]["headers"]["Idempotent-Replayed"]["schema"]["enum"],
            serde_json::json!(["true"])
        );
        assert!(responses["400"]["headers"]["Idempotent-Replayed"].is_object());
        assert!(responses["500"]["headers"]["Idempotent-Replayed"].is_object());
        assert!(
            responses["500"]["description"]
                .as_str()
                .unwrap()
                .starts_with("Broken The idempotency layer failed"),
            "{}",
            responses["500"]
        );

        let problem = &doc["components"]["schemas"]["Problem"];
        for field in ["type", "title", "status", "detail", "code"] {
            assert!(
                problem["properties"][field].is_object(),
                "{field}: {problem}"
            );
            assert!(
                problem["required"]
                    .as_array()
                    .unwrap()
                    .contains(&Value::from(field)),
                "{field}"
            );
        }
        // The unprotected operation is untouched.
        let get = &doc["paths"]["/orders"]["get"];
        assert!(get.get("parameters").is_none(), "{get}");
        assert!(get.get(EXTENSION).is_none(), "{get}");
        assert_eq!(
            get["responses"]
                .as_object()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            ["200"]
        );
        assert!(
            get["responses"]["200"]
                .get("headers")
                .is_none_or(|h| h.as_object().unwrap().is_empty()),
            "{get}"
        );
    }

    #[test]
    fn an_optional_key_and_the_handlers_own_policy() {
        let engine = Idempotency::builder(MemoryStore::new())
            .default_ttl(Duration::from_secs(3600))
            .header_name(http::HeaderName::from_static("x-idempotency-key"))
            .build();
        let config = HandlerConfig::new()
            .lease(Duration::from_secs(90))
            .wait(Duration::from_secs(5))
            .fingerprint(FingerprintMode::Json)
            .on_server_error(OnServerError::Store)
            .key_optional();
        let doc = published(&engine, config);
        let post = &doc["paths"]["/orders"]["post"];
        let key = &post["parameters"][0];
        assert_eq!(key["name"], "X-Idempotency-Key");
        assert_eq!(key["required"], false);
        assert_eq!(key["schema"]["pattern"], key_pattern());
        let policy = &post[EXTENSION];
        assert_eq!(policy["key"], "optional");
        assert_eq!(policy["header"], "X-Idempotency-Key");
        assert_eq!(policy["ttl_seconds"], 3600);
        assert_eq!(policy["lease_seconds"], 90);
        assert_eq!(policy["fingerprint"], "json");
        assert_eq!(policy["on_server_error"], "store");
        assert_eq!(policy["wait_seconds"], 5);
        let description = post["description"].as_str().unwrap();
        assert!(description.contains("waits up to 5s"), "{description}");
        assert!(
            description.contains("(optional: a request without one runs unprotected"),
            "{description}"
        );
        assert!(description.contains("remembered for 1h"), "{description}");
        assert!(description.contains("1m 30s lease"), "{description}");
        assert!(
            description.contains("stored and replayed like any other"),
            "{description}"
        );
        // Without a required key, a missing one is no `400`.
        let bad = post["responses"]["400"]["description"].as_str().unwrap();
        assert!(!bad.contains(codes::KEY_MISSING), "{bad}");
        assert!(bad.contains(codes::KEY_INVALID), "{bad}");
        // A stored 5xx is replayed too.
        assert!(post["responses"]["500"]["headers"]["Idempotent-Replayed"].is_object());
    }

    #[test]
    fn a_missing_operation_is_an_error_and_changes_nothing() {
        let engine = Idempotency::new(MemoryStore::new());
        let mut doc = document();
        let before = serde_json::to_value(&doc).unwrap();
        let err = PublishedPolicy::new(&engine)
            .operation(Method::POST, "/orders", HandlerConfig::new())
            .operation(Method::PUT, "/orders", HandlerConfig::new())
            .apply(&mut doc)
            .unwrap_err();
        assert_eq!(
            err,
            OperationNotFound {
                method: Method::PUT,
                path: "/orders".into()
            }
        );
        assert_eq!(serde_json::to_value(&doc).unwrap(), before);
    }

    #[test]
    fn applying_twice_is_applying_once() {
        let engine = Idempotency::new(MemoryStore::new());
        let policy =
            PublishedPolicy::new(&engine).operation(Method::POST, "/orders", HandlerConfig::new());
        let mut doc = document();
        policy.apply(&mut doc).unwrap();
        let once = serde_json::to_value(&doc).unwrap();
        policy.apply(&mut doc).unwrap();
        assert_eq!(serde_json::to_value(&doc).unwrap(), once);
    }

    #[test]
    #[should_panic(expected = "no operation POST /order to publish")]
    fn as_a_modifier_a_missing_operation_panics() {
        let engine = Idempotency::new(MemoryStore::new());
        PublishedPolicy::new(&engine)
            .operation(Method::POST, "/order", HandlerConfig::new())
            .modify(&mut document());
    }

    #[test]
    fn a_key_parameter_documented_by_hand_is_replaced() {
        let engine = Idempotency::new(MemoryStore::new());
        let mut doc = document();
        doc.paths
            .paths
            .get_mut("/orders")
            .unwrap()
            .post
            .as_mut()
            .unwrap()
            .parameters = Some(vec![
            ParameterBuilder::new()
                .name("idempotency-key")
                .parameter_in(ParameterIn::Header)
                .build(),
        ]);
        PublishedPolicy::new(&engine)
            .operation(Method::POST, "/orders", HandlerConfig::new())
            .apply(&mut doc)
            .unwrap();
        let json = serde_json::to_value(&doc).unwrap();
        let parameters = json["paths"]["/orders"]["post"]["parameters"]
            .as_array()
            .unwrap();
        assert_eq!(parameters.len(), 1);
        assert_eq!(parameters[0]["name"], "Idempotency-Key");
    }

    /// The published `pattern` accepts a key header value exactly when the engine does.
    /// The `regex` crate has no lookahead: the pattern's one lookahead (a quoted key is
    /// not all spaces) is checked as what it means, a value that is not `" *"`.
    fn pattern_accepts(value: &str) -> bool {
        use std::sync::LazyLock;
        static WITHOUT_LOOKAHEAD: LazyLock<regex::Regex> = LazyLock::new(|| {
            let pattern = key_pattern();
            assert_eq!(pattern.matches("(?!").count(), 1, "{pattern}");
            regex::Regex::new(&pattern.replace(r#"(?! *")"#, "")).unwrap()
        });
        static BLANK: LazyLock<regex::Regex> =
            LazyLock::new(|| regex::Regex::new(r#"^" *"$"#).unwrap());
        WITHOUT_LOOKAHEAD.is_match(value) && !BLANK.is_match(value)
    }

    /// Whether the engine accepts `value` as the key header (a value `http` cannot carry
    /// is refused before the engine sees it).
    fn engine_accepts(value: &str) -> bool {
        let name = http::HeaderName::from_static("idempotency-key");
        let Ok(value) = http::HeaderValue::from_str(value) else {
            return false;
        };
        let mut headers = http::HeaderMap::new();
        headers.insert(&name, value);
        crate::key::parse_header(&headers, &name).is_ok()
    }

    #[test]
    fn the_key_pattern_is_the_parsers_rules() {
        let long = "k".repeat(MAX_KEY_LEN);
        let long_quoted = format!(r#""{}""#, "q".repeat(MAX_KEY_LEN));
        let escaped = format!(r#""{}\"""#, "q".repeat(MAX_KEY_LEN - 1));
        let too_long = "k".repeat(MAX_KEY_LEN + 1);
        let too_long_quoted = format!(r#""{}""#, "q".repeat(MAX_KEY_LEN + 1));
        let cases: [(&str, bool); 26] = [
            ("8e03978e-40d5-43e8-bc93-6894a57f9324", true),
            ("0", true),
            (r#""a b""#, true),
            (r#""a\"b\\c""#, true),
            (r#"" x ""#, true),
            (r#""\"""#, true),
            (r"a\b", true),
            (&long, true),
            (&long_quoted, true),
            (&escaped, true),
            ("", false),
            ("a b", false),
            ("a,b", false),
            ("a;b", false),
            (r#"a"b"#, false),
            (r#""""#, false),
            (r#""   ""#, false),
            (r#""abc"x"#, false),
            (r#""abc"#, false),
            (r#""a\b""#, false),
            (r#""abc";p=1"#, false),
            ("\u{e9}", false),
            ("k\u{7f}", false),
            ("a\tb", false),
            (&too_long, false),
            (&too_long_quoted, false),
        ];
        for (value, accepted) in cases {
            assert_eq!(engine_accepts(value), accepted, "engine: {value:?}");
            assert_eq!(pattern_accepts(value), accepted, "pattern: {value:?}");
        }
    }

    proptest::proptest! {
        /// Values made of the characters that matter (quotes, escapes, separators, spaces,
        /// a tab, a non-ASCII letter) and values at the length limit, trimmed as HTTP
        /// trims a field value.
        #[test]
        fn the_key_pattern_agrees_with_the_parser(
            value in r#"[a"\\ ,;\t\u{e9}]{0,8}|"[a"\\ ]{0,6}"?|[a-c]{250,260}|"[a-c]{250,258}""#,
        ) {
            let value = value.trim_matches([' ', '\t']);
            proptest::prop_assert_eq!(pattern_accepts(value), engine_accepts(value), "{:?}", value);
        }
    }

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(human(Duration::from_secs(86_400)), "24h");
        assert_eq!(human(Duration::from_secs(90)), "1m 30s");
        assert_eq!(human(Duration::from_secs(3_661)), "1h 1m 1s");
        assert_eq!(human(Duration::from_millis(1500)), "1s 500ms");
        assert_eq!(human(Duration::ZERO), "0s");
        assert_eq!(seconds(Duration::from_secs(30)), serde_json::json!(30));
        assert_eq!(seconds(Duration::from_millis(1500)), serde_json::json!(1.5));
    }
}
