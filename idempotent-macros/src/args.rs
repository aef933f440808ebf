//! The attribute's arguments: `#[idempotent(scope = caller, ttl = "24h", ...)]`, parsed
//! with `syn::meta::parser`.
//!
//! Parsing never stops at the first mistake in a value: every argument is read, every
//! mistake becomes an error spanned on the offending token, and the caller reports them
//! all at once (next to the untouched function).

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::ToTokens;
use syn::meta::ParseNestedMeta;
use syn::parse::Parser;
use syn::{Expr, Ident, Lit, LitStr, Token};

use std::time::Duration;

use idempotent_policy::duration::{self, DurationErrorKind};

/// Every argument the attribute knows, in the order the docs list them.
pub(crate) const KNOWN: &[&str] = &[
    "scope",
    "state",
    "ttl",
    "lease",
    "max_duration",
    "wait",
    "on_server_error",
    "fingerprint",
    "exclude_headers",
    "key",
    "payload",
    "engine",
    "policy",
    "crate",
];

/// What the attribute is on: an Axum handler, or a consumer function (a plain `async fn`
/// whose key is an expression over its arguments: `key = order.id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Mode {
    #[default]
    Handler,
    Consumer,
}

/// The arguments only an Axum handler has: what each is about, for the error on a
/// consumer function.
const HANDLER_ONLY: &[(&str, &str)] = &[
    (
        "state",
        "the router state; a consumer function finds its engine in an `&Idempotency` \
         argument or `engine = …`",
    ),
    (
        "on_server_error",
        "5xx answers; a consumer function's `Err` always releases the key, so a redelivery \
         runs it again",
    ),
    (
        "fingerprint",
        "the request body; a consumer function is fingerprinted by the JSON of its \
         payload: name it with `payload = order`",
    ),
    (
        "exclude_headers",
        "response headers; a consumer function's output is recorded as JSON",
    ),
];

/// A duration argument: its value and the literal it came from (for spans and messages).
pub(crate) struct DurationArg {
    /// Always positive, in whole milliseconds (the grammar's smallest unit).
    pub(crate) value: Duration,
    /// The literal as written.
    pub(crate) lit: LitStr,
}

/// `on_server_error = release | store`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnServerError {
    Release,
    Store,
}

/// `key = required | optional`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyPolicy {
    /// A request without the header is `400` (the default).
    Required,
    /// A request without the header runs the handler unprotected (rollout).
    Optional,
}

/// `fingerprint = "raw" | "json"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FingerprintMode {
    Raw,
    Json,
}

/// The parsed arguments. Fields are `None` when an argument was omitted (or refused).
#[derive(Default)]
pub(crate) struct Args {
    /// The argument naming the authenticated caller.
    pub(crate) scope: Option<Ident>,
    /// `state = AppState`: the router state, checked to give the engine.
    pub(crate) state: Option<syn::Type>,
    pub(crate) ttl: Option<DurationArg>,
    pub(crate) lease: Option<DurationArg>,
    pub(crate) max_duration: Option<DurationArg>,
    pub(crate) wait: Option<DurationArg>,
    pub(crate) on_server_error: Option<OnServerError>,
    /// The policy's token (`release` / `store`), for errors about the combination.
    pub(crate) on_server_error_span: Option<Span>,
    pub(crate) fingerprint: Option<FingerprintMode>,
    /// Validated, lower-case header names.
    pub(crate) exclude_headers: Option<Vec<LitStr>>,
    /// `key = required | optional`, and the value's token (for errors about the
    /// combination with the handler's arguments).
    pub(crate) key: Option<(KeyPolicy, Span)>,
    /// `policy = NAME`: the name of a `const` that publishes the handler's policy.
    pub(crate) policy: Option<Ident>,
    /// `crate = "..."`: the path the runtime crate is reachable under.
    pub(crate) krate: Option<syn::Path>,
    /// Handler or consumer function (decided before parsing, see `consumer_key`).
    pub(crate) mode: Mode,
    /// A consumer function's `key = <expr>`: the message's id.
    pub(crate) key_expr: Option<Expr>,
    /// A consumer function's `scope = <expr>`: the key space.
    pub(crate) scope_expr: Option<Expr>,
    /// `payload = <expr>`: what a consumer function is fingerprinted by.
    pub(crate) payload: Option<Expr>,
    /// `engine = <expr>`: where a consumer function finds its engine.
    pub(crate) engine: Option<Expr>,
    /// `false` when a syntax error cut parsing short: later arguments are unknown, so a
    /// missing `scope` is not reported on top of it.
    pub(crate) complete: bool,
    /// Arguments seen so far, to refuse duplicates.
    seen: Vec<String>,
}

impl Args {
    /// Parses the attribute's tokens; every mistake is pushed onto `errors`.
    #[cfg(test)]
    pub(crate) fn parse(tokens: TokenStream, errors: &mut Vec<syn::Error>) -> Self {
        Self::parse_as(tokens, Mode::Handler, errors)
    }

    /// Parses the attribute's tokens for a handler or a consumer function; every mistake
    /// is pushed onto `errors`.
    pub(crate) fn parse_as(tokens: TokenStream, mode: Mode, errors: &mut Vec<syn::Error>) -> Self {
        let mut args = Self {
            mode,
            ..Self::default()
        };
        let parser = syn::meta::parser(|meta| args.parse_one(&meta, errors));
        match parser.parse2(tokens) {
            Ok(()) => args.complete = true,
            Err(err) => errors.push(err),
        }
        if let (Some(ttl), Some(lease)) = (&args.ttl, &args.lease)
            && lease.value >= ttl.value
        {
            errors.push(syn::Error::new(
                lease.lit.span(),
                format!(
                    "`lease = {:?}` must be shorter than `ttl = {:?}`: the lease is how long a running \
                     request keeps its claim between heartbeats, the TTL how long the key is \
                     remembered at all; use a lease of seconds, e.g. `lease = \"30s\"`",
                    lease.lit.value(),
                    ttl.lit.value(),
                ),
            ));
        }
        if let (Some(wait), Some(max)) = (&args.wait, &args.max_duration) {
            check_wait(wait, max, errors);
        }
        args
    }

    /// Whether the attribute sets `name` (even to a refused value).
    pub(crate) fn sets(&self, name: &str) -> bool {
        self.seen.iter().any(|seen| seen == name)
    }

    fn parse_one(
        &mut self,
        meta: &ParseNestedMeta<'_>,
        errors: &mut Vec<syn::Error>,
    ) -> syn::Result<()> {
        let Some(name) = meta.path.get_ident().map(Ident::to_string) else {
            let path = meta.path.to_token_stream().to_string().replace(' ', "");
            errors.push(syn::Error::new_spanned(
                &meta.path,
                unknown_message(&format!("`{path}`")),
            ));
            return skip_value(meta);
        };
        if !KNOWN.contains(&name.as_str()) {
            let mut message = unknown_message(&format!("`{name}`"));
            if name == "replay_headers" {
                message = "`replay_headers` is gone: every end-to-end response header is now \
                           stored and replayed (except `Set-Cookie`, `Date` and hop-by-hop \
                           headers); to leave some out, write \
                           `exclude_headers = [\"x-request-id\"]`"
                    .to_owned();
            } else if let Some(close) = closest(&name, KNOWN.iter().copied()) {
                message.push_str(&format!("; did you mean `{close}`?"));
            }
            errors.push(syn::Error::new_spanned(&meta.path, message));
            return skip_value(meta);
        }
        if !meta.input.peek(Token![=]) {
            errors.push(syn::Error::new_spanned(
                &meta.path,
                format!("`{name}` needs a value: write `{}`", example(&name)),
            ));
            return skip_value(meta);
        }
        meta.input.parse::<Token![=]>()?;
        // A type, not an expression: `AppState<Db>` is no expression.
        let value = if name == "state" && !meta.input.peek(LitStr) {
            Value::Type(meta.input.parse()?)
        } else {
            Value::Expr(meta.input.parse()?)
        };
        if self.seen.contains(&name) {
            errors.push(syn::Error::new_spanned(
                &meta.path,
                format!(
                    "duplicate argument `{name}`: it is already set in this attribute; keep one"
                ),
            ));
            return Ok(());
        }
        self.seen.push(name.clone());
        let mut value = match value {
            Value::Type(ty) => {
                if self.mode == Mode::Consumer {
                    errors.push(handler_only(&meta.path, &name));
                } else {
                    self.state = Some(ty);
                }
                return Ok(());
            }
            Value::Expr(value) => value,
        };
        if self.mode == Mode::Consumer {
            match self.consumer_value(&name, &meta.path, value) {
                Ok(None) => return Ok(()),
                Err(err) => {
                    errors.push(err);
                    return Ok(());
                }
                Ok(Some(same)) => value = same,
            }
        } else if name == "payload" || name == "engine" {
            // Kept: they say the function is meant as a consumer function, which then
            // lacks its `key` (reported with the function at hand, see `consumer`).
            let slot = if name == "payload" {
                &mut self.payload
            } else {
                &mut self.engine
            };
            *slot = Some(value);
            return Ok(());
        }
        let outcome = match name.as_str() {
            "scope" => scope_value(&value).map(|ident| self.scope = Some(ident)),
            "state" => Err(state_string(&value)),
            "ttl" => duration_value("ttl", &value).map(|d| self.ttl = Some(d)),
            "lease" => duration_value("lease", &value).map(|d| self.lease = Some(d)),
            "max_duration" => {
                duration_value("max_duration", &value).map(|d| self.max_duration = Some(d))
            }
            "wait" => duration_value("wait", &value).map(|d| self.wait = Some(d)),
            "on_server_error" => on_server_error_value(&value).map(|(policy, span)| {
                self.on_server_error = Some(policy);
                self.on_server_error_span = Some(span);
            }),
            "fingerprint" => fingerprint_value(&value).map(|mode| self.fingerprint = Some(mode)),
            "exclude_headers" => exclude_headers_value(&value, errors)
                .map(|names| self.exclude_headers = Some(names)),
            "key" => key_value(&value).map(|policy| self.key = Some(policy)),
            "policy" => policy_value(&value).map(|name| self.policy = Some(name)),
            "crate" => crate_value(&value).map(|path| self.krate = Some(path)),
            _ => unreachable!("every known argument is handled"),
        };
        if let Err(err) = outcome {
            errors.push(err);
        }
        Ok(())
    }

    /// A consumer function's reading of the arguments that differ from a handler's:
    /// `Ok(None)` when taken, `Ok(Some(value))` back for the ones read alike
    /// (durations, `policy`, `crate`).
    fn consumer_value(
        &mut self,
        name: &str,
        path: &syn::Path,
        value: Expr,
    ) -> syn::Result<Option<Expr>> {
        let outcome = match name {
            "key" => match string_literal(&value) {
                // A handler's policy on a consumer function: kept, to be reported with
                // the function at hand (see `consumer::missing_key`).
                None if plain_ident(&value)
                    .is_some_and(|ident| ident == "required" || ident == "optional") =>
                {
                    self.key = Some(key_value(&value)?);
                    Ok(())
                }
                Some(lit) => Err(syn::Error::new(
                    lit.span(),
                    format!(
                        "`key = {:?}` is the same key for every message: `key` is an expression \
                         over the function's arguments that gives each message's id, e.g. \
                         `key = order.id`",
                        lit.value()
                    ),
                )),
                None => {
                    self.key_expr = Some(value);
                    Ok(())
                }
            },
            "scope" => {
                self.scope_expr = Some(value);
                Ok(())
            }
            "payload" => {
                self.payload = Some(value);
                Ok(())
            }
            "engine" => {
                self.engine = Some(value);
                Ok(())
            }
            _ => {
                if !HANDLER_ONLY.iter().any(|(known, _)| *known == name) {
                    return Ok(Some(value));
                }
                Err(handler_only(path, name))
            }
        };
        outcome.map(|()| None)
    }
}

/// The error for a handler's argument (`state`, `on_server_error`, …) on a consumer
/// function.
fn handler_only(path: &syn::Path, name: &str) -> syn::Error {
    let about = HANDLER_ONLY
        .iter()
        .find(|(known, _)| *known == name)
        .map_or("", |(_, about)| about);
    syn::Error::new_spanned(
        path,
        format!(
            "`{name}` is for Axum handlers ({about}); remove it from this consumer function's \
             attribute"
        ),
    )
}

/// How the attribute's `key = …` is written, read before the arguments are parsed: it
/// decides, with the function, whether they are a handler's or a consumer function's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyShape {
    /// No `key`, or `key` without a value.
    Absent,
    /// `key = required` / `key = optional`: a handler's key policy.
    Policy,
    /// A literal (`key = "id"`, `key = 1`).
    Literal,
    /// A single name other than the policies: an argument's, or a misspelt policy.
    Name(String),
    /// Any other expression (`key = order.id`, `key = msg.id()`): a consumer's key.
    Expression,
}

/// Finds `key = …` among the attribute's top-level arguments and says how it is written.
pub(crate) fn key_shape(tokens: &TokenStream) -> KeyShape {
    let trees: Vec<TokenTree> = tokens.clone().into_iter().collect();
    let mut segments =
        trees.split(|tree| matches!(tree, TokenTree::Punct(p) if p.as_char() == ','));
    let Some(segment) = segments.find(|segment| {
        matches!(segment, [TokenTree::Ident(name), TokenTree::Punct(eq), ..]
            if name == "key" && eq.as_char() == '=')
    }) else {
        return KeyShape::Absent;
    };
    match &segment[2..] {
        [] => KeyShape::Absent,
        [TokenTree::Ident(name)] if name == "required" || name == "optional" => KeyShape::Policy,
        [TokenTree::Ident(name)] => KeyShape::Name(name.to_string()),
        [TokenTree::Literal(_)] => KeyShape::Literal,
        _ => KeyShape::Expression,
    }
}

/// An argument's value: a type for `state`, an expression for the others.
enum Value {
    Type(syn::Type),
    Expr(Expr),
}

/// A wait longer than the handler may run never ends in a replay that a shorter one would
/// miss. Checked only against a `max_duration` written beside it: the engine's default is
/// configured at run time, and the engine cuts a longer wait to it.
fn check_wait(wait: &DurationArg, max: &DurationArg, errors: &mut Vec<syn::Error>) {
    if wait.value > max.value {
        errors.push(syn::Error::new(
            wait.lit.span(),
            format!(
                "`wait = {:?}` is longer than the handler may run (`max_duration = {:?}`): the \
                 original has a recorded outcome by then, so a longer wait gains nothing and \
                 keeps the client hanging; write a few seconds, e.g. `wait = \"5s\"`",
                wait.lit.value(),
                max.lit.value()
            ),
        ));
    }
}

fn unknown_message(what: &str) -> String {
    let known: Vec<String> = KNOWN.iter().map(|k| format!("`{k}`")).collect();
    format!(
        "unknown argument {what} for `#[idempotent]`; the known arguments are {}",
        known.join(", ")
    )
}

/// How each argument is written, for messages.
fn example(name: &str) -> &'static str {
    match name {
        "scope" => "scope = caller",
        "state" => "state = AppState",
        "ttl" => "ttl = \"24h\"",
        "lease" => "lease = \"30s\"",
        "max_duration" => "max_duration = \"2m\"",
        "wait" => "wait = \"5s\"",
        "on_server_error" => "on_server_error = release",
        "fingerprint" => "fingerprint = \"raw\"",
        "exclude_headers" => "exclude_headers = [\"x-request-id\"]",
        "key" => "key = optional",
        "payload" => "payload = order",
        "engine" => "engine = state.idempotency",
        "policy" => "policy = CREATE_PAYMENT_POLICY",
        _ => "crate = \"idempotent_runtime\"",
    }
}

/// Consumes an unusable argument's tokens up to the next top-level comma, so parsing
/// goes on and later mistakes are reported too.
fn skip_value(meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
    meta.input.step(|cursor| {
        let mut rest = *cursor;
        while let Some((tt, next)) = rest.token_tree() {
            if matches!(&tt, TokenTree::Punct(p) if p.as_char() == ',') {
                break;
            }
            rest = next;
        }
        Ok(((), rest))
    })
}

fn string_literal(value: &Expr) -> Option<&LitStr> {
    match value {
        Expr::Lit(lit) => match &lit.lit {
            Lit::Str(s) => Some(s),
            _ => None,
        },
        _ => None,
    }
}

fn plain_ident(value: &Expr) -> Option<&Ident> {
    match value {
        Expr::Path(path) if path.qself.is_none() && path.attrs.is_empty() => path.path.get_ident(),
        _ => None,
    }
}

fn scope_value(value: &Expr) -> syn::Result<Ident> {
    if let Some(ident) = plain_ident(value) {
        return Ok(ident.clone());
    }
    if let Some(lit) = string_literal(value) {
        return Err(syn::Error::new(
            lit.span(),
            format!(
                "`scope` names an argument, not a string: write `scope = {}` without quotes",
                lit.value()
            ),
        ));
    }
    if let Expr::Field(_) | Expr::MethodCall(_) = value {
        return Err(syn::Error::new_spanned(
            value,
            "`scope` names a whole argument of the handler, e.g. `scope = caller`; to scope by \
             a field, implement `Scope` for the argument's type and return that field",
        ));
    }
    Err(syn::Error::new_spanned(
        value,
        "`scope` takes the name of the handler argument that identifies the authenticated \
         caller, e.g. `scope = caller`",
    ))
}

/// `state = "AppState"`: the only value of `state` read as an expression.
fn state_string(value: &Expr) -> syn::Error {
    let name = string_literal(value).map_or_else(|| "AppState".to_owned(), LitStr::value);
    syn::Error::new_spanned(
        value,
        format!(
            "`state` names the router state's type, not a string: write `state = {name}` \
             without quotes"
        ),
    )
}

fn duration_value(name: &str, value: &Expr) -> syn::Result<DurationArg> {
    let Some(lit) = string_literal(value) else {
        return Err(syn::Error::new_spanned(
            value,
            format!(
                "`{name}` takes a duration string with units, e.g. `{}` (ms, s, m, h, d; \
                 combinations like \"1h 30m\")",
                example(name)
            ),
        ));
    };
    match duration::parse(&lit.value()) {
        Ok(value) => Ok(DurationArg {
            value,
            lit: lit.clone(),
        }),
        // A zero wait reads like "do not wait": say how that is written.
        Err(error) if name == "wait" && *error.kind() == DurationErrorKind::Zero => {
            Err(syn::Error::new(
                lit.span(),
                format!(
                    "`wait = {:?}` is zero: to answer `409` at once, leave `wait` out (waiting \
                     is off by default); to wait, write a few seconds, e.g. `wait = \"5s\"`",
                    lit.value()
                ),
            ))
        }
        Err(error) if *error.kind() == DurationErrorKind::Zero => Err(syn::Error::new(
            lit.span(),
            format!(
                "`{name} = {:?}` is zero: it must be positive, e.g. `{}`",
                lit.value(),
                example(name)
            ),
        )),
        Err(error) => Err(syn::Error::new(lit.span(), format!("`{name}`: {error}"))),
    }
}

/// The policy and the span of its token.
fn on_server_error_value(value: &Expr) -> syn::Result<(OnServerError, Span)> {
    const EXPECTED: &str = "expected `release` (the default: a 5xx frees the key so a retry runs \
                            the handler again) or `store` (the 5xx is stored and replayed)";
    if let Some(ident) = plain_ident(value) {
        return match ident.to_string().as_str() {
            "release" => Ok((OnServerError::Release, ident.span())),
            "store" => Ok((OnServerError::Store, ident.span())),
            other => Err(syn::Error::new(
                ident.span(),
                format!("unknown `on_server_error` policy `{other}`: {EXPECTED}"),
            )),
        };
    }
    if let Some(lit) = string_literal(value) {
        let text = lit.value();
        let message = if text == "release" || text == "store" {
            format!("write `on_server_error = {text}` without quotes")
        } else {
            format!("unknown `on_server_error` policy {text:?}: {EXPECTED}")
        };
        return Err(syn::Error::new(lit.span(), message));
    }
    Err(syn::Error::new_spanned(
        value,
        format!("unknown `on_server_error` policy: {EXPECTED}"),
    ))
}

fn key_value(value: &Expr) -> syn::Result<(KeyPolicy, Span)> {
    const EXPECTED: &str = "expected `required` (the default: a request without an \
                            `Idempotency-Key` header is refused with 400) or `optional` (for a \
                            rollout: such a request runs the handler unprotected)";
    if let Some(ident) = plain_ident(value) {
        return match ident.to_string().as_str() {
            "required" => Ok((KeyPolicy::Required, ident.span())),
            "optional" => Ok((KeyPolicy::Optional, ident.span())),
            other => Err(syn::Error::new(
                ident.span(),
                format!(
                    "unknown `key` policy `{other}`: {EXPECTED}. On a function that is not an \
                     Axum handler (a consumer's), `key` is the message's id, an expression over \
                     its arguments: e.g. `key = msg.id` with an argument `msg`"
                ),
            )),
        };
    }
    if let Some(lit) = string_literal(value) {
        let text = lit.value();
        let message = if text == "required" || text == "optional" {
            format!("write `key = {text}` without quotes")
        } else {
            format!("unknown `key` policy {text:?}: {EXPECTED}")
        };
        return Err(syn::Error::new(lit.span(), message));
    }
    Err(syn::Error::new_spanned(
        value,
        format!("unknown `key` policy: {EXPECTED}"),
    ))
}

/// `policy = NAME`: a plain identifier, the name of the `const` to define.
fn policy_value(value: &Expr) -> syn::Result<Ident> {
    if let Some(ident) = plain_ident(value) {
        return Ok(ident.clone());
    }
    if let Some(lit) = string_literal(value) {
        return Err(syn::Error::new(
            lit.span(),
            format!(
                "`policy` names the constant to define, not a string: write `policy = {}` \
                 without quotes",
                lit.value()
            ),
        ));
    }
    Err(syn::Error::new_spanned(
        value,
        "`policy` takes the name of a constant to define with the handler's policy, e.g. \
         `policy = CREATE_PAYMENT_POLICY`",
    ))
}

fn fingerprint_value(value: &Expr) -> syn::Result<FingerprintMode> {
    const EXPECTED: &str = "expected \"raw\" (the default: any byte of the body counts) or \"json\" \
                            (key order and whitespace of a JSON body are ignored)";
    if let Some(lit) = string_literal(value) {
        return match lit.value().as_str() {
            "raw" => Ok(FingerprintMode::Raw),
            "json" => Ok(FingerprintMode::Json),
            other => Err(syn::Error::new(
                lit.span(),
                format!("unknown fingerprint mode {other:?}: {EXPECTED}"),
            )),
        };
    }
    if let Some(ident) = plain_ident(value) {
        let text = ident.to_string();
        let message = if text == "raw" || text == "json" {
            format!("write `fingerprint = \"{text}\"` with quotes")
        } else {
            format!("unknown fingerprint mode `{text}`: {EXPECTED}")
        };
        return Err(syn::Error::new(ident.span(), message));
    }
    Err(syn::Error::new_spanned(
        value,
        format!("unknown fingerprint mode: {EXPECTED}"),
    ))
}

/// Reads `["x-a", "x-b"]`. Bad names are pushed onto `errors` one by one; the list is
/// refused (returns the first error) only when it is not a list at all.
fn exclude_headers_value(value: &Expr, errors: &mut Vec<syn::Error>) -> syn::Result<Vec<LitStr>> {
    let Expr::Array(array) = value else {
        return Err(syn::Error::new_spanned(
            value,
            "`exclude_headers` takes a list of lower-case header names, e.g. \
             `exclude_headers = [\"x-request-id\"]`",
        ));
    };
    let mut names = Vec::new();
    for elem in &array.elems {
        let Some(lit) = string_literal(elem) else {
            errors.push(syn::Error::new_spanned(
                elem,
                "write each header name as a string, e.g. \"x-request-id\"",
            ));
            continue;
        };
        match check_header_name(&lit.value()) {
            Ok(()) => names.push(lit.clone()),
            Err(message) => errors.push(syn::Error::new(lit.span(), message)),
        }
    }
    Ok(names)
}

/// A header name must be an RFC 9110 token, written lower-case (as HTTP/2 sends it and
/// the store keeps it), and not one the engine never replays anyway.
fn check_header_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("empty header name: write e.g. \"x-request-id\"".to_owned());
    }
    let is_tchar = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if let Some(bad) = name.chars().find(|&c| !is_tchar(c)) {
        return Err(format!(
            "{name:?} is not a valid header name ({bad:?} is not allowed): use letters, digits \
             and `-`, e.g. \"x-request-id\""
        ));
    }
    if name.chars().any(|c| c.is_ascii_uppercase()) {
        return Err(format!(
            "header names in `exclude_headers` are lower-case: write {:?}",
            name.to_ascii_lowercase()
        ));
    }
    if let Some(reason) = idempotent_policy::never_replayed_because(name) {
        return Err(format!(
            "{name:?} is never replayed anyway ({reason}); remove it from `exclude_headers`"
        ));
    }
    Ok(())
}

fn crate_value(value: &Expr) -> syn::Result<syn::Path> {
    let Some(lit) = string_literal(value) else {
        return Err(syn::Error::new_spanned(
            value,
            "`crate` takes the path of the runtime crate as a string, e.g. `crate = \"my_runtime\"`",
        ));
    };
    lit.parse::<syn::Path>().map_err(|_| {
        syn::Error::new(
            lit.span(),
            format!(
                "{:?} is not a path: `crate` names the runtime crate as you import it, e.g. \
                 `crate = \"my_runtime\"`",
                lit.value()
            ),
        )
    })
}

/// The candidate closest to `name` when it looks like a typo of it.
pub(crate) fn closest<'a>(
    name: &str,
    candidates: impl Iterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .map(|candidate| (edit_distance(name, candidate), candidate))
        .filter(|&(distance, candidate)| distance > 0 && distance <= (candidate.len().max(3) / 3))
        .min_by_key(|&(distance, _)| distance)
        .map(|(_, candidate)| candidate)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = if ca == *cb {
                diagonal
            } else {
                1 + diagonal.min(above).min(row[j])
            };
            diagonal = above;
        }
    }
    row[b.len()]
}

/// The span of the whole attribute, for errors about something missing from it.
pub(crate) fn attribute_span() -> Span {
    Span::call_site()
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn parse(tokens: TokenStream) -> (Args, Vec<String>) {
        let mut errors = Vec::new();
        let args = Args::parse(tokens, &mut errors);
        (args, errors.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn parses_every_argument() {
        let (args, errors) = parse(quote! {
            scope = caller, ttl = "1h30m", lease = "10s", max_duration = "2m", on_server_error = store,
            fingerprint = "json", exclude_headers = ["x-request-id", "x-b"], key = optional,
            crate = "renamed",
        });
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            args.key.map(|(policy, _)| policy),
            Some(KeyPolicy::Optional)
        );
        assert!(args.complete);
        assert_eq!(args.scope.unwrap(), "caller");
        assert_eq!(args.ttl.unwrap().value, Duration::from_secs(5_400));
        assert_eq!(args.lease.unwrap().value, Duration::from_secs(10));
        assert_eq!(args.max_duration.unwrap().value, Duration::from_secs(120));
        assert_eq!(args.on_server_error, Some(OnServerError::Store));
        assert_eq!(args.fingerprint, Some(FingerprintMode::Json));
        assert_eq!(args.exclude_headers.unwrap().len(), 2);
        assert!(args.krate.unwrap().is_ident("renamed"));
    }

    #[test]
    fn state_is_a_type() {
        let (args, errors) = parse(quote!(scope = c, state = AppState<Db>, ttl = "1h"));
        assert!(errors.is_empty() && args.complete, "{errors:?}");
        let state = args.state.unwrap();
        assert_eq!(quote!(#state).to_string(), "AppState < Db >");
        let (args, errors) = parse(quote!(scope = c, state = "AppState", state = Other));
        assert!(args.complete);
        assert_eq!(
            errors,
            [
                "`state` names the router state's type, not a string: write `state = AppState` \
                 without quotes",
                "duplicate argument `state`: it is already set in this attribute; keep one",
            ]
        );
        assert!(args.state.is_none(), "a refused value sets nothing");
    }

    #[test]
    fn reports_every_mistake_at_once() {
        let (args, errors) = parse(quote! {
            scope = "caller", tll = "1h", ttl = 24, ttl = "2h", lease,
            on_server_error = "store", fingerprint = json, exclude_headers = ["X-Cost", "set-cookie", "a b"],
        });
        assert!(args.complete);
        let expected = [
            "without quotes",
            "did you mean `ttl`?",
            "takes a duration string",
            "duplicate argument `ttl`",
            "`lease` needs a value",
            "write `on_server_error = store` without quotes",
            "write `fingerprint = \"json\"` with quotes",
            "are lower-case: write \"x-cost\"",
            "\"set-cookie\" is never replayed anyway",
            "is not a valid header name",
        ];
        assert_eq!(errors.len(), expected.len(), "{errors:#?}");
        for (error, expected) in errors.iter().zip(expected) {
            assert!(
                error.contains(expected),
                "{error:?} should contain {expected:?}"
            );
        }
    }

    #[test]
    fn odd_values_are_explained() {
        let (args, errors) = parse(quote! {
            a::b = 1, scope = caller.account_id, crate = "not a path", exclude_headers = [x],
            on_server_error = "retry", fingerprint = 1,
        });
        assert!(args.complete);
        let expected = [
            "unknown argument `a::b`",
            "to scope by a field, implement `Scope`",
            "is not a path",
            "write each header name as a string",
            "unknown `on_server_error` policy \"retry\"",
            "unknown fingerprint mode:",
        ];
        assert_eq!(errors.len(), expected.len(), "{errors:#?}");
        for (error, expected) in errors.iter().zip(expected) {
            assert!(
                error.contains(expected),
                "{error:?} should contain {expected:?}"
            );
        }
        let (args, errors) = parse(quote!(scope = c, wait = "5s"));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(args.wait.map(|w| w.value), Some(Duration::from_secs(5)));
        let (_, errors) = parse(quote!(scope = c, wait = "0s"));
        assert!(
            errors[0]
                .contains("`wait = \"0s\"` is zero: to answer `409` at once, leave `wait` out"),
            "{errors:?}"
        );
        let (_, errors) = parse(quote!(scope = c, wait = "soon"));
        assert!(errors[0].contains("`wait`: invalid duration"), "{errors:?}");
        // The engine's default maximum duration is configured at run time: not checked here.
        let (args, errors) = parse(quote!(scope = c, wait = "10m"));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(args.wait.map(|w| w.value), Some(Duration::from_secs(600)));
        let (_, errors) = parse(quote!(scope = c, max_duration = "30s", wait = "1m"));
        assert!(
            errors[0].contains(
                "`wait = \"1m\"` is longer than the handler may run (`max_duration = \"30s\"`)"
            ),
            "{errors:?}"
        );
        let (_, errors) = parse(quote!(scope = c, replay_headers = ["x-request-cost"]));
        assert!(
            errors[0].contains("`replay_headers` is gone")
                && errors[0].contains("exclude_headers = [\"x-request-id\"]"),
            "{errors:?}"
        );
    }

    #[test]
    fn key_policies() {
        let (args, errors) = parse(quote!(scope = c, key = required));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            args.key.map(|(policy, _)| policy),
            Some(KeyPolicy::Required)
        );
        let (args, errors) = parse(quote!(scope = c));
        assert!(errors.is_empty() && args.key.is_none());
        let (args, errors) = parse(quote! {
            key = sometimes, key = optional, key = "optional", key = "maybe", key = 1,
        });
        let expected = [
            "unknown `key` policy `sometimes`: expected `required`",
            "duplicate argument `key`",
            "duplicate argument `key`",
            "duplicate argument `key`",
            "duplicate argument `key`",
        ];
        assert_eq!(errors.len(), expected.len(), "{errors:#?}");
        for (error, expected) in errors.iter().zip(expected) {
            assert!(
                error.contains(expected),
                "{error:?} should contain {expected:?}"
            );
        }
        assert!(args.key.is_none(), "a refused value sets nothing");
        for (tokens, expected) in [
            (
                quote!(key = "optional"),
                "write `key = optional` without quotes",
            ),
            (quote!(key = "maybe"), "unknown `key` policy \"maybe\""),
            (quote!(key = 1), "unknown `key` policy: expected"),
            (quote!(key), "`key` needs a value: write `key = optional`"),
            (quote!(keys = optional), "did you mean `key`?"),
        ] {
            let (_, errors) = parse(tokens);
            assert_eq!(errors.len(), 1, "{errors:?}");
            assert!(
                errors[0].contains(expected),
                "{errors:?} should contain {expected:?}"
            );
        }
    }

    /// The list is the engine's own: every header it strips is refused, with its reason.
    #[test]
    fn every_header_the_engine_never_replays_is_refused() {
        for (name, reason) in idempotent_policy::NEVER_REPLAYED_BECAUSE {
            let error = check_header_name(name).unwrap_err();
            assert!(
                error.contains("is never replayed anyway") && error.contains(reason),
                "{error}"
            );
        }
        assert!(check_header_name("proxy-authenticate").is_err());
        assert_eq!(check_header_name("x-request-id"), Ok(()));
    }

    #[test]
    fn lease_must_be_shorter_than_ttl() {
        let (_, errors) = parse(quote!(scope = c, ttl = "1m", lease = "60s"));
        assert_eq!(errors.len(), 1);
        assert!(errors[0].contains("must be shorter"), "{errors:?}");
        let (_, errors) = parse(quote!(scope = c, ttl = "1m", lease = "59s"));
        assert!(errors.is_empty());
        let (_, errors) = parse(quote!(scope = c, ttl = "1s", lease = "1000ms"));
        assert!(errors[0].contains("must be shorter"), "{errors:?}");
    }

    /// The grammar is `idempotent_policy::duration`'s (tested there): what the demos' flags
    /// read, the attribute reads, milliseconds and spaces included.
    #[test]
    fn durations_are_the_shared_grammar() {
        let (args, errors) = parse(quote!(scope = c, ttl = "1h 30m", lease = "1s500ms"));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(args.ttl.unwrap().value, Duration::from_secs(5_400));
        assert_eq!(args.lease.unwrap().value, Duration::from_millis(1_500));
        let (_, errors) = parse(quote!(scope = c, ttl = "1.5h"));
        assert_eq!(
            errors,
            [
                "`ttl`: invalid duration \"1.5h\": write whole numbers, e.g. \"1h30m\"; the units \
                 are ms, s, m, h and d, e.g. \"500ms\", \"90s\", \"15m\", \"24h\", \"7d\" or \
                 \"1h 30m\""
            ]
        );
        let (_, errors) = parse(quote!(scope = c, lease = "0ms"));
        assert_eq!(
            errors,
            ["`lease = \"0ms\"` is zero: it must be positive, e.g. `lease = \"30s\"`"]
        );
    }

    #[test]
    fn syntax_errors_mark_the_arguments_incomplete() {
        let (args, errors) = parse(quote!(scope = caller ttl = "1h"));
        assert!(!args.complete);
        assert_eq!(errors.len(), 1);
    }

    /// How `key = …` is written decides, with the function, handler or consumer
    /// function: only a key expression (or an argument's name) makes a consumer one.
    #[test]
    fn key_shapes() {
        assert_eq!(key_shape(&quote!(scope = c)), KeyShape::Absent);
        assert_eq!(
            key_shape(&quote!(scope = c, key = optional)),
            KeyShape::Policy
        );
        assert_eq!(key_shape(&quote!(key = required)), KeyShape::Policy);
        assert_eq!(key_shape(&quote!(key = "id")), KeyShape::Literal);
        assert_eq!(
            key_shape(&quote!(scope = "orders", key = id)),
            KeyShape::Name("id".to_owned())
        );
        assert_eq!(
            key_shape(&quote!(key = order.id, scope = "o")),
            KeyShape::Expression
        );
        assert_eq!(key_shape(&quote!(key = msg.id())), KeyShape::Expression);
        // A type's comma is no argument's end that matters: `key` is still found.
        assert_eq!(
            key_shape(&quote!(state = AppState<A, B>, key = order.id)),
            KeyShape::Expression
        );
        assert_eq!(key_shape(&quote!(key)), KeyShape::Absent);
    }

    #[test]
    fn consumer_arguments() {
        let mut errors = Vec::new();
        let args = Args::parse_as(
            quote!(
                key = order.id,
                scope = "orders",
                payload = order,
                engine = app.engine,
                ttl = "1h"
            ),
            Mode::Consumer,
            &mut errors,
        );
        assert!(errors.is_empty(), "{errors:?}");
        assert!(args.key_expr.is_some() && args.scope_expr.is_some());
        assert!(args.payload.is_some() && args.engine.is_some() && args.ttl.is_some());
        let mut errors = Vec::new();
        let args = Args::parse_as(
            quote!(
                key = "id",
                scope = "o",
                on_server_error = store,
                state = AppState,
                key = optional
            ),
            Mode::Consumer,
            &mut errors,
        );
        let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(errors.len(), 4, "{errors:#?}");
        assert!(
            errors[0].contains("the same key for every message"),
            "{errors:?}"
        );
        assert!(
            errors[1].contains("`on_server_error` is for Axum handlers"),
            "{errors:?}"
        );
        assert!(
            errors[2].contains("`state` is for Axum handlers"),
            "{errors:?}"
        );
        assert!(errors[3].contains("duplicate argument `key`"), "{errors:?}");
        assert!(args.key_expr.is_none());
    }

    #[test]
    fn suggests_close_names_only() {
        assert_eq!(closest("scop", KNOWN.iter().copied()), Some("scope"));
        assert_eq!(
            closest("exclude_header", KNOWN.iter().copied()),
            Some("exclude_headers")
        );
        assert_eq!(closest("retries", KNOWN.iter().copied()), None);
    }
}
