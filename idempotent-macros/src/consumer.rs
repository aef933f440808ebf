//! `#[idempotent(key = …, scope = …)]` on a plain `async fn`: a consumer's handler or a
//! job, run once per message id through `Idempotency::once`.
//!
//! ```text
//! pub async fn charge(idempotency: &Idempotency, order: Order) -> Outcome<Receipt, ChargeError> {
//!     async fn charge(order: Order, key: IdempotencyKey) -> Result<Receipt, ChargeError> { body }
//!     const __CONFIG: HandlerConfig = HandlerConfig::new().name(..).ttl(..);
//!     let __engine = Clone::clone(Engine::engine(&(idempotency)));
//!     let __scope = ScopeText::scope_text(&("orders"));
//!     let __key = KeyText::key_text(&(order.id));
//!     let __payload = Payload::payload_fingerprint(&(order));
//!     once::<Receipt, ChargeError, _, _>(&__engine, &__CONFIG, &__scope, &__key, __payload,
//!         move |__key| charge(order, __key)).await
//! }
//! ```
//!
//! The attribute's expressions are evaluated in the wrapper, where the arguments have
//! their names (so `order.id` is the user's expression, and a missing field is rustc's
//! own error on it), before the arguments move into the run: the body runs detached from
//! the call, so everything it gets is owned.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Expr, FnArg, GenericArgument, Ident, ItemFn, Pat, PatType, PathArguments, Type};

use crate::args::{self, Args, KeyPolicy};
use crate::signature::{self, ParamKind};

/// Why `func` is a consumer function rather than an Axum handler, if it says so itself:
/// it takes the engine (`&Idempotency`, which no extractor is; a handler reaches it
/// through the router state), or returns an `Outcome`. `None` when it could be a
/// handler. (An argument by reference is no extractor either, but it is a handler's
/// mistake as often, with errors of its own.)
pub(crate) fn not_a_handler(func: &ItemFn) -> Option<String> {
    for input in &func.sig.inputs {
        let FnArg::Typed(arg) = input else { continue };
        let ty = signature::unparen(&arg.ty);
        let name = arg.pat.to_token_stream().to_string();
        if is_engine(ty) {
            return Some(format!(
                "it takes the engine, `{name}: {}`",
                signature::type_to_string(&arg.ty)
            ));
        }
    }
    if let syn::ReturnType::Type(_, ty) = &func.sig.output
        && last_segment(ty).is_some_and(|segment| segment.ident == "Outcome")
    {
        return Some("it returns an `Outcome`".to_owned());
    }
    None
}

/// Whether `func` has an argument bound to the plain name `name`.
pub(crate) fn has_argument(func: &ItemFn, name: &str) -> bool {
    func.sig.inputs.iter().any(|input| match input {
        FnArg::Typed(arg) => plain(&arg.pat).is_some_and(|ident| ident == name),
        FnArg::Receiver(_) => false,
    })
}

/// The error for a function that is meant as a consumer function (see
/// [`not_a_handler`], or it was given `payload`/`engine`) but has no key expression.
pub(crate) fn missing_key(func: &ItemFn, args: &Args, reason: Option<String>) -> syn::Error {
    let name = &func.sig.ident;
    let what = match &reason {
        Some(reason) => format!("`{name}` is no Axum handler ({reason})"),
        None => {
            let given = if args.payload.is_some() {
                "payload"
            } else {
                "engine"
            };
            format!("`{name}` is given `{given} = …`, which only a consumer function takes")
        }
    };
    let message = example_argument(func);
    let scope = if args.scope.is_some() || args.scope_expr.is_some() {
        ""
    } else {
        ", scope = \"orders\""
    };
    let fix = format!(
        "name the message's id with `key = …`, an expression over its arguments, e.g. \
         `#[idempotent(key = {message}.id{scope})]`"
    );
    if let Some((policy, span)) = args.key {
        let policy = match policy {
            KeyPolicy::Required => "required",
            KeyPolicy::Optional => "optional",
        };
        return syn::Error::new(
            span,
            format!(
                "`key = {policy}` is an Axum handler's key policy, and {what}: it is a consumer \
                 function, run once per message id; {fix}"
            ),
        );
    }
    syn::Error::new(
        args::attribute_span(),
        format!(
            "missing `key`: {what}, so `#[idempotent]` makes it a consumer function, run once \
             per message id; {fix}"
        ),
    )
}

/// The first argument that could hold a message, for the examples in messages.
fn example_argument(func: &ItemFn) -> String {
    func.sig
        .inputs
        .iter()
        .find_map(|input| match input {
            FnArg::Typed(arg)
                if !is_engine(signature::unparen(&arg.ty))
                    && !signature::is_idempotency_key(&arg.ty)
                    && !matches!(signature::unparen(&arg.ty), Type::Reference(r) if signature::is_transaction(&r.elem)) =>
            {
                plain(&arg.pat).map(ToString::to_string)
            }
            _ => None,
        })
        .unwrap_or_else(|| "msg".to_owned())
}

/// A refused consumer function: kept as written, under its own name, so that its body is
/// checked and its callers' arguments too; the attribute's errors beside it. Without the
/// lints the attribute would have silenced: the engine argument is unused in a body
/// that never gets it, and "prefix it with an underscore" would be the wrong fix.
pub(crate) fn refused(func: &ItemFn, errors: &[syn::Error]) -> TokenStream {
    let errors = errors.iter().map(syn::Error::to_compile_error);
    quote! {
        #[allow(unused_variables, dead_code)]
        #func
        #(#errors)*
    }
}

/// What fills one argument of a consumer function.
#[derive(Clone, Copy)]
enum Kind<'a> {
    /// A value the caller passes, moved into the body.
    Value,
    /// The engine the call runs through; `borrowed` when `&Idempotency` (then the body
    /// does not get it: it cannot borrow from the call).
    Engine { borrowed: bool },
    /// `IdempotencyKey`: the claimed key, handed over by the engine.
    Key,
    /// `&mut Tx<DB>`: the transaction the engine opens; holds `Tx<DB>`.
    Tx(&'a Type),
}

struct Param<'a> {
    arg: &'a PatType,
    name: &'a Ident,
    kind: Kind<'a>,
}

/// The whole consumer function: its checks, then the expansion or the refusal.
pub(crate) fn expand(args: &Args, func: &ItemFn, mut errors: Vec<syn::Error>) -> TokenStream {
    let params = check(args, func, &mut errors);
    let output = result_types(func, &mut errors);
    match (params, output) {
        (Some(params), Some((ok, err))) if errors.is_empty() => {
            generate(args, func, &params, ok, err)
        }
        _ => refused(func, &errors),
    }
}

fn check<'a>(
    args: &'a Args,
    func: &'a ItemFn,
    errors: &mut Vec<syn::Error>,
) -> Option<Vec<Param<'a>>> {
    let before = errors.len();
    let sig = &func.sig;
    let name = &sig.ident;
    if sig.asyncness.is_none() {
        errors.push(syn::Error::new(
            sig.fn_token.span,
            format!(
                "`#[idempotent]` functions must be `async`: write `async fn {name}`; calling it \
                 runs the body through the engine, which awaits it (and, to a duplicate, the \
                 store)"
            ),
        ));
    }
    if let Some(constness) = &sig.constness {
        errors.push(syn::Error::new(
            constness.span,
            "`#[idempotent]` functions cannot be `const fn`: they await the store",
        ));
    }
    if let syn::Safety::Unsafe(token) = &sig.safety {
        errors.push(syn::Error::new(
            token.span,
            "`#[idempotent]` functions cannot be `unsafe fn`: the engine calls the body as a \
             safe function",
        ));
    }
    if let Some(abi) = &sig.abi {
        errors.push(syn::Error::new_spanned(
            abi,
            "`#[idempotent]` functions use the Rust ABI: remove the `extern`",
        ));
    }
    if let Some(variadic) = &sig.variadic {
        errors.push(syn::Error::new_spanned(
            variadic.dots,
            "`#[idempotent]` functions cannot be variadic",
        ));
    }
    for param in &sig.generics.params {
        errors.push(syn::Error::new_spanned(
            param,
            "`#[idempotent]` functions cannot be generic: the output's type is what is \
             recorded and replayed, and the arguments move into a run that may outlive the \
             call; use concrete types",
        ));
    }
    if let Some(where_clause) = &sig.generics.where_clause {
        errors.push(syn::Error::new_spanned(
            where_clause,
            "`#[idempotent]` functions cannot have a `where` clause: their types must be \
             concrete",
        ));
    }
    signature::check_no_self_in(func, "function", errors);

    let mut params: Vec<Param<'a>> = Vec::new();
    // An argument without a name: what the expressions name is not known, and errors
    // about them would follow from that one.
    let mut unnamed = false;
    for input in &sig.inputs {
        let arg = match input {
            FnArg::Receiver(receiver) => {
                errors.push(syn::Error::new_spanned(
                    receiver,
                    "`#[idempotent]` functions cannot take `self`: the body runs detached from \
                     the call (a duplicate may take the key over when this call is dropped), \
                     so it cannot borrow from it. Make it a free function that takes the \
                     engine (`idempotency: &Idempotency`) and what it needs by value",
                ));
                continue;
            }
            FnArg::Typed(arg) => arg,
        };
        if let Some(attr) = arg.attrs.first() {
            errors.push(syn::Error::new_spanned(
                attr,
                "attributes on the arguments of an `#[idempotent]` function are not supported: \
                 the wrapper takes every argument, so a `#[cfg]` would remove it from your \
                 function but not from the wrapper",
            ));
        }
        let Some(name) = plain(&arg.pat) else {
            errors.push(syn::Error::new_spanned(
                &arg.pat,
                format!(
                    "the arguments of an `#[idempotent]` function are bound by name, since the \
                     attribute's `key`, `scope` and `payload` name them: write `{}: {}` and \
                     destructure it in the body",
                    snake_name(&arg.ty),
                    signature::type_to_string(&arg.ty)
                ),
            ));
            unnamed = true;
            continue;
        };
        if let Some(span) = signature::impl_trait_in(&arg.ty) {
            errors.push(syn::Error::new(
                span,
                "`impl Trait` makes the function generic; `#[idempotent]` functions need \
                 concrete argument types: name the type",
            ));
        }
        let ty = signature::unparen(&arg.ty);
        let kind = if args.engine.is_none() && is_engine(ty) {
            Kind::Engine {
                borrowed: matches!(ty, Type::Reference(_)),
            }
        } else {
            match signature::param_kind(&arg.ty, errors) {
                ParamKind::Key if signature::is_optional_key(&arg.ty) => {
                    errors.push(syn::Error::new_spanned(
                        &arg.ty,
                        "a consumer function always runs under a key (`key = …`): take \
                         `IdempotencyKey`",
                    ));
                    Kind::Key
                }
                ParamKind::Key => Kind::Key,
                ParamKind::Tx(tx) => Kind::Tx(tx),
                ParamKind::Extractor => {
                    if let Type::Reference(reference) = ty
                        && !signature::is_transaction(&reference.elem)
                    {
                        errors.push(syn::Error::new_spanned(
                            &arg.ty,
                            format!(
                                "take `{name}` by value, `{name}: {}`: the body runs detached \
                                 from the call (a duplicate may take the key over when this \
                                 call is dropped), so its arguments are owned and `'static`",
                                signature::type_to_string(&reference.elem)
                            ),
                        ));
                    }
                    Kind::Value
                }
            }
        };
        let duplicate = match kind {
            Kind::Key => params
                .iter()
                .any(|p| matches!(p.kind, Kind::Key))
                .then_some("only one `IdempotencyKey` argument is allowed; clone it in the body"),
            Kind::Tx(_) => params
                .iter()
                .any(|p| matches!(p.kind, Kind::Tx(_)))
                .then_some(
                    "only one transaction argument is allowed: the function's writes and its \
                     record commit in one transaction",
                ),
            Kind::Engine { .. } => params
                .iter()
                .any(|p| matches!(p.kind, Kind::Engine { .. }))
                .then_some("only one engine argument is allowed: the call runs through one"),
            Kind::Value => None,
        };
        if let Some(message) = duplicate {
            errors.push(syn::Error::new_spanned(&arg.ty, message));
        }
        params.push(Param { arg, name, kind });
    }

    if args.engine.is_none() && !params.iter().any(|p| matches!(p.kind, Kind::Engine { .. })) {
        errors.push(syn::Error::new(
            args::attribute_span(),
            format!(
                "`{name}` has no engine to run through: take it as an argument \
                 (`idempotency: &Idempotency`), or name it with `engine = …`, e.g. \
                 `engine = app.idempotency` for an argument `app` that holds it"
            ),
        ));
    }
    // The body does not get a borrowed engine (it cannot borrow from the call): a use of
    // it there would be rustc's "cannot find value"; say why, with the fix.
    if let Some(param) = params
        .iter()
        .find(|p| matches!(p.kind, Kind::Engine { borrowed: true }))
        && let Some(span) = first_use(func.block.to_token_stream(), param.name)
    {
        errors.push(syn::Error::new(
            span,
            format!(
                "the body of `{name}` does not get `{0}`, the engine it runs through: the body \
                 runs detached from the call, so it cannot borrow from it. Take \
                 `{0}: Idempotency` by value (a cheap clone) to use it in the body",
                param.name
            ),
        ));
    }

    if unnamed {
        return None;
    }
    match &args.key_expr {
        Some(key) => check_names(key, "key", func, &params, errors),
        // A refused `key` (a literal) was reported already.
        None if args.sets("key") && args.key.is_none() => {}
        None => errors.push(missing_key(func, args, not_a_handler(func))),
    }
    match &args.scope_expr {
        Some(scope) => check_names(scope, "scope", func, &params, errors),
        None if args.complete => errors.push(syn::Error::new(
            args::attribute_span(),
            format!(
                "missing `scope`: name the key space `{name}`'s ids are unique in, e.g. \
                 `scope = \"orders\"` (the queue, stream or topic) or an expression over its \
                 arguments (`scope = {}.tenant`). There is no default: one named after the \
                 function would change when it is renamed, and every message would run again",
                example_argument(func)
            ),
        )),
        None => {}
    }
    if let Some(engine) = &args.engine {
        check_names(engine, "engine", func, &params, errors);
    }
    match &args.payload {
        Some(payload) => check_names(payload, "payload", func, &params, errors),
        None => {
            let values: Vec<&Param<'_>> = params
                .iter()
                .filter(|p| matches!(p.kind, Kind::Value))
                .collect();
            if values.len() != 1 {
                let names: Vec<String> = values.iter().map(|p| format!("`{}`", p.name)).collect();
                let which = if values.is_empty() {
                    format!(
                        "`{name}` takes no message to fingerprint: add it as an argument, or \
                         write `payload = ()` if the key alone says what runs"
                    )
                } else {
                    format!(
                        "`{name}` takes {} values ({}): name the one the key must keep \
                         meaning, e.g. `payload = {}`",
                        values.len(),
                        names.join(", "),
                        values[0].name
                    )
                };
                errors.push(syn::Error::new(
                    args::attribute_span(),
                    format!(
                        "missing `payload`: {which}. Its JSON is fingerprinted, and the same key \
                         with another payload is `Outcome::KeyReused`"
                    ),
                ));
            }
        }
    }
    (errors.len() == before).then_some(params)
}

/// The `T` and `E` of the declared `Result<T, E>`, which the wrapper returns as
/// `Outcome<T, E>`.
fn result_types<'a>(
    func: &'a ItemFn,
    errors: &mut Vec<syn::Error>,
) -> Option<(&'a Type, &'a Type)> {
    const WHY: &str = "`Ok(T)` is recorded and replayed to every duplicate, `Err(E)` \
                       releases the key so that a redelivery runs the function again; calling \
                       the function returns `Outcome<T, E>`";
    let ty = match &func.sig.output {
        syn::ReturnType::Type(_, ty) => ty,
        syn::ReturnType::Default => {
            errors.push(syn::Error::new(
                func.sig.ident.span(),
                format!(
                    "an `#[idempotent]` function returns `Result<T, E>`: add e.g. \
                     `-> Result<(), MyError>`; {WHY}"
                ),
            ));
            return None;
        }
    };
    let Some(segment) = last_segment(ty).filter(|segment| segment.ident == "Result") else {
        errors.push(syn::Error::new_spanned(
            ty,
            format!(
                "an `#[idempotent]` function returns `Result<T, E>`, not `{}`: {WHY}. A \
                 failure every duplicate must get is an output: put it in `T`",
                signature::type_to_string(ty)
            ),
        ));
        return None;
    };
    let types: Vec<&Type> = match &segment.arguments {
        PathArguments::AngleBracketed(generics) => generics
            .args
            .iter()
            .filter_map(|arg| match arg {
                GenericArgument::Type(ty) => Some(ty),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    match types.as_slice() {
        [ok, err] => Some((ok, err)),
        _ => {
            errors.push(syn::Error::new_spanned(
                ty,
                format!(
                    "write the error type: `Result<T, E>` in full (e.g. `Result<Receipt, \
                     anyhow::Error>`), since the function then returns `Outcome<T, E>` and the \
                     attribute needs both; {WHY}"
                ),
            ));
            None
        }
    }
}

/// Refuses an expression whose root is a name that is no argument (a typo: rustc would
/// say "cannot find value" without the arguments it could be), or the key or transaction
/// the engine hands the body (they do not exist yet when the expression is evaluated).
/// Fields and methods are left to rustc, whose error is on the user's token.
fn check_names(
    expr: &Expr,
    what: &str,
    func: &ItemFn,
    params: &[Param<'_>],
    errors: &mut Vec<syn::Error>,
) {
    let Some(root) = root_name(expr) else { return };
    let text = root.to_string();
    if text.starts_with(|c: char| c.is_ascii_uppercase()) {
        // A constant or a unit struct: rustc knows better.
        return;
    }
    match params.iter().find(|p| p.name == root) {
        Some(param) => {
            let handed = match param.kind {
                Kind::Key => "the `IdempotencyKey` the engine hands the body",
                Kind::Tx(_) => "the transaction the engine opens for the body",
                Kind::Value | Kind::Engine { .. } => return,
            };
            errors.push(syn::Error::new(
                root.span(),
                format!(
                    "`{what} = …` names `{root}`, {handed}, which does not exist before the \
                     call runs; name the message's argument instead, e.g. `{what} = {}{}`",
                    example_argument(func),
                    match what {
                        "key" => ".id",
                        "scope" => ".tenant",
                        _ => "",
                    }
                ),
            ));
        }
        None => {
            let names: Vec<String> = params
                .iter()
                .filter(|p| matches!(p.kind, Kind::Value | Kind::Engine { .. }))
                .map(|p| p.name.to_string())
                .collect();
            let hint = match args::closest(&text, names.iter().map(String::as_str)) {
                Some(close) => format!("; did you mean `{close}`?"),
                None if names.is_empty() => String::new(),
                None => format!(
                    "; its arguments are {}",
                    names
                        .iter()
                        .map(|n| format!("`{n}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            errors.push(syn::Error::new(
                root.span(),
                format!(
                    "`{what} = …` names `{root}`, which is no argument of `{}`{hint}",
                    func.sig.ident
                ),
            ));
        }
    }
}

/// The name an expression starts from: `order` in `order.id`, `&order.lines[0]`,
/// `order.id.to_string()`; `None` for anything else (a literal, a call).
fn root_name(expr: &Expr) -> Option<&Ident> {
    match expr {
        Expr::Path(path) if path.qself.is_none() => path.path.get_ident(),
        Expr::Field(field) => root_name(&field.base),
        Expr::MethodCall(call) => root_name(&call.receiver),
        Expr::Index(index) => root_name(&index.expr),
        Expr::Reference(reference) => root_name(&reference.expr),
        Expr::Paren(paren) => root_name(&paren.expr),
        Expr::Group(group) => root_name(&group.expr),
        _ => None,
    }
}

/// The first token `name` in `tokens` (shadowing aside: a false alarm only when the body
/// binds the engine's name anew, and the fix still holds).
fn first_use(tokens: TokenStream, name: &Ident) -> Option<Span> {
    tokens.into_iter().find_map(|tree| match tree {
        TokenTree::Ident(ident) if ident == *name => Some(ident.span()),
        TokenTree::Group(group) => first_use(group.stream(), name),
        _ => None,
    })
}

/// `Idempotency` or a reference to it, under any path.
fn is_engine(ty: &Type) -> bool {
    let ty = match signature::unparen(ty) {
        Type::Reference(reference) => signature::unparen(&reference.elem),
        ty => ty,
    };
    last_segment(ty)
        .is_some_and(|segment| segment.ident == "Idempotency" && segment.arguments.is_none())
}

fn last_segment(ty: &Type) -> Option<&syn::PathSegment> {
    match signature::unparen(ty) {
        Type::Path(path) if path.qself.is_none() => path.path.segments.last(),
        _ => None,
    }
}

/// The name of an argument bound as a whole, by move (`order`, `mut order`).
fn plain(pat: &Pat) -> Option<&Ident> {
    match pat {
        Pat::Ident(ident) if ident.by_ref.is_none() && ident.subpat.is_none() => Some(&ident.ident),
        _ => None,
    }
}

fn generate(
    args: &Args,
    func: &ItemFn,
    params: &[Param<'_>],
    ok: &Type,
    err: &Type,
) -> TokenStream {
    let krate = match &args.krate {
        Some(path) => quote!(#path),
        None => quote!(::idempotent_runtime),
    };
    let p = quote!(#krate::__private);
    // As on a handler: `#[tracing::instrument]` goes on the inner function (the body's
    // work, the user's parameter names), every other attribute on the wrapper.
    let (inner_attrs, attrs): (Vec<_>, Vec<_>) = func.attrs.iter().partition(|attr| {
        attr.path()
            .segments
            .last()
            .is_some_and(|segment| segment.ident == "instrument")
    });
    let vis = &func.vis;
    let name = &func.sig.ident;
    let asyncness = &func.sig.asyncness;
    let fn_token = &func.sig.fn_token;
    let output = &func.sig.output;
    let block = &func.block;

    // The wrapper takes what the caller passes (the values and the engine), by their
    // names (without `mut`: the wrapper only moves them on); the inner function is the
    // user's, minus a borrowed engine.
    let wrapper_params = params
        .iter()
        .filter(|p| matches!(p.kind, Kind::Value | Kind::Engine { .. }))
        .map(|p| {
            let param_name = p.name;
            let ty = &p.arg.ty;
            quote!(#param_name: #ty)
        });
    let body_params = params
        .iter()
        .filter(|p| !matches!(p.kind, Kind::Engine { borrowed: true }));
    let inner_params = body_params.clone().map(|p| p.arg);
    let call_args = body_params.map(|p| match p.kind {
        Kind::Value | Kind::Engine { .. } => p.name.to_token_stream(),
        Kind::Key => quote!(__key),
        Kind::Tx(_) => quote!(&mut __tx),
    });
    let key_param = if params.iter().any(|p| matches!(p.kind, Kind::Key)) {
        quote!(__key)
    } else {
        quote!(_)
    };

    let config = crate::expand::config(args, name, &p);
    let (policy_item, config) = match &args.policy {
        Some(policy) => {
            let cfgs = func.attrs.iter().filter(|attr| attr.path().is_ident("cfg"));
            let doc = format!(
                " The `#[idempotent]` policy of `{name}` (its `HandlerConfig`), for publishing it."
            );
            let item = quote! {
                #(#cfgs)*
                #[doc = #doc]
                #vis const #policy: #p::HandlerConfig = #config;
            };
            (item, quote!(#policy))
        }
        None => (TokenStream::new(), config),
    };

    // Each expression through its trait, spanned on the user's expression: a value of the
    // wrong type is reported there, with the trait's message.
    let engine = match &args.engine {
        Some(expr) => expr.to_token_stream(),
        None => params
            .iter()
            .find(|p| matches!(p.kind, Kind::Engine { .. }))
            .map(|p| p.name.to_token_stream())
            .expect("checked: an engine argument or `engine = …`"),
    };
    let engine = quote_spanned!(engine.span()=> #p::Engine::engine(&(#engine)));
    let key = args
        .key_expr
        .as_ref()
        .expect("checked: a consumer function has a key");
    let key = quote_spanned!(key.span()=> #p::KeyText::key_text(&(#key)));
    let scope = args
        .scope_expr
        .as_ref()
        .expect("checked: `scope` is required");
    let scope = quote_spanned!(scope.span()=> #p::ScopeText::scope_text(&(#scope)));
    let payload = match &args.payload {
        Some(expr) => expr.to_token_stream(),
        None => params
            .iter()
            .find(|p| matches!(p.kind, Kind::Value))
            .map(|p| p.name.to_token_stream())
            .expect("checked: one value argument, or `payload = …`"),
    };
    let payload = quote_spanned!(payload.span()=> #p::Payload::payload_fingerprint(&(#payload)));

    // The engine's bounds (`T` recordable, the future `Send + 'static`) are reported on
    // the `T` the user wrote: every part of the call is spanned there, so that rustc's
    // reports of one unmet bound (on the call, its turbofish, its `.await`) coincide and
    // are shown once.
    let bound_span = ok.span();
    let p_run = respan(p.clone(), bound_span);
    let run = match params.iter().find_map(|p| match p.kind {
        Kind::Tx(tx) => Some(tx),
        _ => None,
    }) {
        None => quote_spanned! {bound_span=>
            #p_run::once::<#ok, #err, _, _>(
                &__engine, &__CONFIG, &__scope, &__key, __payload,
                move |#key_param| #name(#(#call_args),*),
            )
            .await
        },
        Some(tx) => quote_spanned! {bound_span=>
            #p_run::once_in_transaction::<#ok, #err, _, _, _>(
                &__engine, &__CONFIG, &__scope, &__key, __payload,
                move |#key_param, mut __tx: #tx| async move {
                    let __result = #name(#(#call_args),*).await;
                    (__result, __tx)
                },
            )
            .await
        },
    };

    let body = quote! {
        #(#inner_attrs)*
        // `async fn` of the macro's own: the attribute requires `async`, so a lint on the
        // user's tokens asking to drop it (`clippy::unused_async`) would be wrong.
        async fn #name(#(#inner_params),*) #output #block
        const __CONFIG: #p::HandlerConfig = #config;
        // Owned: the engine may be a field of an argument that moves into the run.
        let __engine = ::core::clone::Clone::clone(#engine);
        let __scope = #scope;
        let __key = #key;
        let __payload = #payload;
        #run
    };
    // The user's braces, as on a handler: the item stays in user code for `dead_code`.
    let mut body = proc_macro2::Group::new(proc_macro2::Delimiter::Brace, body);
    body.set_span(block.brace_token.span.join());
    quote! {
        #policy_item
        #(#attrs)*
        #vis #asyncness #fn_token #name(#(#wrapper_params),*) -> #p::Outcome<#ok, #err>
        #body
    }
}

/// `tokens` with every span set to `span` (the runtime's path in the engine call, so
/// that it is reported where the call is).
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut tree| {
            if let TokenTree::Group(group) = &tree {
                let mut respanned =
                    proc_macro2::Group::new(group.delimiter(), respan(group.stream(), span));
                respanned.set_span(span);
                tree = TokenTree::Group(respanned);
            } else {
                tree.set_span(span);
            }
            tree
        })
        .collect()
}

/// A name for an argument of type `ty`, for messages: `Order` → `order`, `OrderLine` →
/// `order_line`; `msg` for a type without a name.
fn snake_name(ty: &Type) -> String {
    let Some(segment) = last_segment(ty) else {
        return "msg".to_owned();
    };
    let mut name = String::new();
    for (index, c) in segment.ident.to_string().chars().enumerate() {
        if c.is_ascii_uppercase() {
            if index > 0 {
                name.push('_');
            }
            name.push(c.to_ascii_lowercase());
        } else {
            name.push(c);
        }
    }
    name
}
