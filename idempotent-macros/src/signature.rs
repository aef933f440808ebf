//! Checks on the annotated function: what a handler must look like for the expansion to
//! work, each refusal spanned on the token to change.

use quote::ToTokens;
use syn::{FnArg, GenericParam, Ident, ItemFn, Pat, PatType, Safety, Type};

use crate::args::{self, Args, KeyPolicy, OnServerError};

/// Axum implements `Handler` for functions of at most this many arguments.
const AXUM_MAX_ARGS: usize = 16;

/// A handler that passed every check.
pub(crate) struct Handler<'a> {
    /// The function as written.
    pub(crate) func: &'a ItemFn,
    /// Its arguments, in order.
    pub(crate) params: Vec<Param<'a>>,
    /// The index in `params` of the scope argument.
    pub(crate) scope: usize,
}

/// One argument of the handler.
pub(crate) struct Param<'a> {
    /// The argument as written.
    pub(crate) arg: &'a PatType,
    /// What fills it.
    pub(crate) kind: ParamKind<'a>,
}

/// Where an argument's value comes from.
#[derive(Clone, Copy)]
pub(crate) enum ParamKind<'a> {
    /// An Axum extractor: an argument of the wrapper.
    Extractor,
    /// `IdempotencyKey` (or `Option<IdempotencyKey>` under `key = optional`): the claimed
    /// key, handed over by the engine.
    Key,
    /// `&mut Tx<DB>`: the transaction the engine opens (the transactional unit of work); holds `Tx<DB>`.
    Tx(&'a Type),
}

impl Param<'_> {
    /// Whether the wrapper extracts this argument.
    pub(crate) fn is_extractor(&self) -> bool {
        matches!(self.kind, ParamKind::Extractor)
    }
}

impl Handler<'_> {
    /// The arguments that stay extractors of the wrapper, with their index in `params`.
    pub(crate) fn extractors(&self) -> impl Iterator<Item = (usize, &Param<'_>)> {
        self.params
            .iter()
            .enumerate()
            .filter(|(_, p)| p.is_extractor())
    }

    /// The transaction type (`Tx<DB>`) when the handler is transactional.
    pub(crate) fn transaction(&self) -> Option<&Type> {
        self.params.iter().find_map(|p| match p.kind {
            ParamKind::Tx(ty) => Some(ty),
            _ => None,
        })
    }

    /// Whether the wrapper appends `Hashed<()>` instead of wrapping the last extractor:
    /// when there is no extractor besides the scope, or the scope is last (authentication
    /// must not wait for the body, and is never a body extractor).
    pub(crate) fn appends_unit_hash(&self) -> bool {
        self.extractors()
            .last()
            .is_none_or(|(index, _)| index == self.scope)
    }
}

/// Checks `func` against the arguments; every refusal is pushed onto `errors`. Returns
/// the handler when nothing was refused.
pub(crate) fn check<'a>(
    func: &'a ItemFn,
    args: &Args,
    errors: &mut Vec<syn::Error>,
) -> Option<Handler<'a>> {
    let before = errors.len();
    let sig = &func.sig;
    let name = &sig.ident;

    if sig.asyncness.is_none() {
        errors.push(syn::Error::new(
            sig.fn_token.span,
            format!(
                "`#[idempotent]` handlers must be `async`: write `async fn {name}`; the handler \
                 runs inside the engine, which awaits it"
            ),
        ));
    }
    if let Some(constness) = &sig.constness {
        errors.push(syn::Error::new(
            constness.span,
            "`#[idempotent]` handlers cannot be `const fn`",
        ));
    }
    if let Safety::Unsafe(token) = &sig.safety {
        errors.push(syn::Error::new(
            token.span,
            "`#[idempotent]` handlers cannot be `unsafe fn`: Axum calls handlers as safe functions",
        ));
    }
    if let Some(abi) = &sig.abi {
        errors.push(syn::Error::new_spanned(
            abi,
            "`#[idempotent]` handlers use the Rust ABI: remove the `extern`",
        ));
    }
    check_generics(func, errors);
    check_no_self(func, errors);
    if let Some(variadic) = &sig.variadic {
        errors.push(syn::Error::new_spanned(
            variadic.dots,
            "`#[idempotent]` handlers cannot be variadic",
        ));
    }

    let mut params = Vec::new();
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(receiver) => errors.push(syn::Error::new_spanned(
                receiver,
                "`#[idempotent]` handlers cannot take `self`: an Axum handler is a free function. \
                 Move it out of the `impl` block and reach shared data through `State`",
            )),
            FnArg::Typed(arg) => {
                if let Some(attr) = arg.attrs.first() {
                    errors.push(syn::Error::new_spanned(
                        attr,
                        "attributes on the arguments of an `#[idempotent]` handler are not \
                         supported: the wrapper extracts every argument, so a `#[cfg]` would \
                         remove it from your function but not from the wrapper. Put the \
                         `#[cfg]` on the whole handler (and its route) instead",
                    ));
                }
                if let Some(span_of_impl) = impl_trait_in(&arg.ty) {
                    errors.push(syn::Error::new(
                        span_of_impl,
                        "`impl Trait` makes the handler generic; `#[idempotent]` handlers need \
                         concrete argument types: name the type",
                    ));
                }
                if let Some(message) = key_argument_mistake(arg, args) {
                    errors.push(syn::Error::new_spanned(&arg.ty, message));
                }
                let kind = param_kind(&arg.ty, errors);
                let duplicate = match kind {
                    ParamKind::Key => params
                        .iter()
                        .any(|p: &Param<'_>| matches!(p.kind, ParamKind::Key))
                        .then_some(
                            "only one `IdempotencyKey` argument is allowed; clone it in the body \
                             if you need it twice",
                        ),
                    ParamKind::Tx(_) => params
                        .iter()
                        .any(|p| matches!(p.kind, ParamKind::Tx(_)))
                        .then_some(
                            "only one transaction argument is allowed: the handler's writes and \
                             the stored response commit in one transaction",
                        ),
                    ParamKind::Extractor => None,
                };
                if let Some(message) = duplicate {
                    errors.push(syn::Error::new_spanned(&arg.ty, message));
                }
                params.push(Param { arg, kind });
            }
        }
    }

    // A transactional handler's 5xx rolls its writes back, so the engine
    // releases the claim; storing that answer is not something it can do.
    if args.on_server_error == Some(OnServerError::Store)
        && params.iter().any(|p| matches!(p.kind, ParamKind::Tx(_)))
    {
        errors.push(syn::Error::new(
            args.on_server_error_span
                .unwrap_or_else(args::attribute_span),
            "a transactional handler always rolls back and releases on a 5xx (its writes must \
             not commit with a failure); remove `on_server_error = store`, or drop the \
             `&mut Tx` argument to store 5xx answers",
        ));
    }

    // Rust 2024: an `impl Trait` in the return type captures every lifetime in scope,
    // the `&mut Tx` borrow included, so the result could not be handed back with the
    // transaction. Say so on the `impl`, with the fix the compiler would only hint at.
    if params.iter().any(|p| matches!(p.kind, ParamKind::Tx(_)))
        && let syn::ReturnType::Type(_, output) = &sig.output
        && let Some(span) = capturing_impl_trait_in(output)
    {
        errors.push(syn::Error::new(
            span,
            "in a transactional handler, an `impl Trait` return type captures the `&mut Tx` \
             borrow (Rust 2024), so the engine could not commit the transaction after it: \
             write `impl IntoResponse + use<>` (it borrows nothing), or name the type",
        ));
    }

    check_key_policy(args, &params, errors);

    let scope = match &args.scope {
        Some(scope) => find_scope(func, &params, scope, errors),
        None => {
            if args.complete {
                errors.push(syn::Error::new(
                    args::attribute_span(),
                    missing_scope(&params),
                ));
            }
            None
        }
    };

    let extractors = params.iter().filter(|p| p.is_extractor()).count();
    if let Some(scope) = scope {
        let handler = Handler {
            func,
            params,
            scope,
        };
        let wrapper_args = 1 + extractors + usize::from(handler.appends_unit_hash());
        if wrapper_args > AXUM_MAX_ARGS {
            errors.push(syn::Error::new(
                sig.paren_token.span.join(),
                format!(
                    "too many arguments: Axum handlers take at most {AXUM_MAX_ARGS} arguments and \
                     `#[idempotent]` adds {} (the key guard{}); group some extractors into one \
                     (e.g. a struct implementing `FromRequestParts`)",
                    wrapper_args - extractors,
                    if handler.appends_unit_hash() {
                        " and the request hash"
                    } else {
                        ""
                    },
                ),
            ));
        }
        if errors.len() == before {
            return Some(handler);
        }
    }
    None
}

/// `key = optional` hands the handler `Option<IdempotencyKey>` (a request without a key
/// runs unprotected), a required key `IdempotencyKey`; transactional handlers need a key.
fn check_key_policy(args: &Args, params: &[Param<'_>], errors: &mut Vec<syn::Error>) {
    let optional = match args.key {
        Some((KeyPolicy::Optional, span)) => Some(span),
        _ => None,
    };
    for param in params.iter().filter(|p| matches!(p.kind, ParamKind::Key)) {
        let ty = &param.arg.ty;
        match (optional.is_some(), is_optional_key(ty)) {
            (true, false) => errors.push(syn::Error::new_spanned(
                ty,
                "with `key = optional` a request without a key runs the handler unprotected, \
                 with no key to hand over: take `Option<IdempotencyKey>` (`None` when it ran \
                 unprotected)",
            )),
            (false, true) => errors.push(syn::Error::new_spanned(
                ty,
                "`Option<IdempotencyKey>` goes with `key = optional`; here every request has a \
                 key: take `IdempotencyKey`, or add `key = optional` to let requests without \
                 one run unprotected",
            )),
            _ => {}
        }
    }
    if let Some(span) = optional
        && params.iter().any(|p| matches!(p.kind, ParamKind::Tx(_)))
    {
        errors.push(syn::Error::new(
            span,
            "`key = optional` is not supported on a transactional handler: its writes commit \
             with the stored response, which needs a key; remove `key = optional`",
        ));
    }
}

/// `Self` in a handler inside an `impl` block: the body moves into a nested function,
/// where `Self` does not name the outer type (E0401); say so on the first `Self`.
pub(crate) fn check_no_self(func: &ItemFn, errors: &mut Vec<syn::Error>) {
    check_no_self_in(func, "handler", errors);
}

/// [`check_no_self`] for a function called `what` in the message (`handler`, `function`).
pub(crate) fn check_no_self_in(func: &ItemFn, what: &str, errors: &mut Vec<syn::Error>) {
    use proc_macro2::{Delimiter, TokenTree};
    // The first `Self` outside a nested `impl`/`trait` block (where it is fine).
    fn first_self(tokens: proc_macro2::TokenStream) -> Option<proc_macro2::Span> {
        let mut in_item_header = false;
        for tree in tokens {
            match tree {
                TokenTree::Ident(ident) if ident == "impl" || ident == "trait" => {
                    in_item_header = true;
                }
                TokenTree::Group(group)
                    if in_item_header && group.delimiter() == Delimiter::Brace =>
                {
                    in_item_header = false;
                }
                TokenTree::Ident(ident) if ident == "Self" && !in_item_header => {
                    return Some(ident.span());
                }
                TokenTree::Group(group) if !in_item_header => {
                    if let Some(span) = first_self(group.stream()) {
                        return Some(span);
                    }
                }
                _ => {}
            }
        }
        None
    }
    use quote::ToTokens;
    let sig = &func.sig;
    let found = first_self(sig.inputs.to_token_stream())
        .or_else(|| first_self(sig.output.to_token_stream()))
        .or_else(|| first_self(func.block.to_token_stream()));
    if let Some(span) = found {
        errors.push(syn::Error::new(
            span,
            format!(
                "`Self` cannot be used in an `#[idempotent]` {what}: the macro moves the body \
                 into a nested function, where `Self` does not name the `impl` block's type. \
                 Write the type's name instead"
            ),
        ));
    }
}

fn check_generics(func: &ItemFn, errors: &mut Vec<syn::Error>) {
    for param in &func.sig.generics.params {
        let message = match param {
            GenericParam::Type(ty) => format!(
                "`#[idempotent]` handlers cannot be generic: replace the type parameter `{}` \
                 with the concrete type the route uses",
                ty.ident
            ),
            GenericParam::Const(c) => format!(
                "`#[idempotent]` handlers cannot be generic: replace the const parameter `{}` \
                 with a constant",
                c.ident
            ),
            GenericParam::Lifetime(l) => format!(
                "`#[idempotent]` handlers cannot have lifetime parameters: the handler runs \
                 detached from the request, so its arguments must be owned (`'static`); \
                 remove `{}`",
                l.lifetime
            ),
        };
        errors.push(syn::Error::new_spanned(param, message));
    }
    if let Some(where_clause) = &func.sig.generics.where_clause {
        errors.push(syn::Error::new_spanned(
            where_clause,
            "`#[idempotent]` handlers cannot have a `where` clause: their types must be concrete",
        ));
    }
}

/// Finds the argument `scope` names; refuses a binding inside a destructuring pattern,
/// the `IdempotencyKey` argument and names that match no argument.
fn find_scope(
    func: &ItemFn,
    params: &[Param<'_>],
    scope: &Ident,
    errors: &mut Vec<syn::Error>,
) -> Option<usize> {
    if let Some(index) = params
        .iter()
        .position(|p| plain_name(&p.arg.pat) == Some(scope))
    {
        let what = match params[index].kind {
            ParamKind::Extractor => return Some(index),
            ParamKind::Key => "the `IdempotencyKey` argument",
            ParamKind::Tx(_) => "the transaction",
        };
        errors.push(syn::Error::new(
            scope.span(),
            format!(
                "`scope = {scope}` names {what}; the scope is the authenticated caller the key \
                 belongs to, e.g. `scope = caller`"
            ),
        ));
        return None;
    }
    if let Some(param) = params.iter().find(|p| binds(&p.arg.pat, scope)) {
        errors.push(syn::Error::new_spanned(
            &param.arg.pat,
            format!(
                "`scope = {scope}` names a binding inside a destructuring pattern; the scope must \
                 be a whole argument with a plain name: write `{scope}: {}` and destructure it in \
                 the body",
                type_to_string(&param.arg.ty)
            ),
        ));
        return None;
    }
    let names: Vec<&Ident> = params
        .iter()
        .filter(|p| p.is_extractor())
        .filter_map(|p| plain_name(&p.arg.pat))
        .collect();
    let texts: Vec<String> = names.iter().map(ToString::to_string).collect();
    let hint = match args::closest(&scope.to_string(), texts.iter().map(String::as_str)) {
        Some(close) => format!("; did you mean `{close}`?"),
        None if names.is_empty() => format!(
            "; `{}` has no argument with a plain name: add the authenticated caller, e.g. \
             `caller: Caller`",
            func.sig.ident
        ),
        None => format!("; its arguments with a plain name are {}", list(&names)),
    };
    errors.push(syn::Error::new(
        scope.span(),
        format!(
            "`scope = {scope}` names no argument of `{}`{hint}",
            func.sig.ident
        ),
    ));
    None
}

fn missing_scope(params: &[Param<'_>]) -> String {
    let names: Vec<&Ident> = params
        .iter()
        .filter(|p| p.is_extractor())
        .filter_map(|p| plain_name(&p.arg.pat))
        .collect();
    let mut message = "missing `scope`: name the argument that identifies the authenticated \
                       caller, e.g. `#[idempotent(scope = caller)]` for an argument \
                       `caller: Caller`; keys are unique per caller"
        .to_owned();
    if !names.is_empty() {
        message.push_str(&format!(
            " (arguments with a plain name here: {})",
            list(&names)
        ));
    }
    message
}

fn list(names: &[&Ident]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The name of an argument bound as a whole (`caller`, `mut caller`, `caller @ ..`).
fn plain_name(pat: &Pat) -> Option<&Ident> {
    match pat {
        Pat::Ident(ident) => Some(&ident.ident),
        _ => None,
    }
}

/// Whether `pat` binds `name` anywhere inside it.
fn binds(pat: &Pat, name: &Ident) -> bool {
    match pat {
        Pat::Ident(ident) => {
            ident.ident == *name || ident.subpat.as_ref().is_some_and(|(_, p)| binds(p, name))
        }
        Pat::Struct(s) => s.fields.iter().any(|f| binds(&f.pat, name)),
        Pat::TupleStruct(s) => s.elems.iter().any(|p| binds(p, name)),
        Pat::Tuple(t) => t.elems.iter().any(|p| binds(p, name)),
        Pat::Slice(s) => s.elems.iter().any(|p| binds(p, name)),
        Pat::Or(o) => o.cases.iter().any(|p| binds(p, name)),
        Pat::Paren(p) => binds(&p.pat, name),
        Pat::Reference(r) => binds(&r.pat, name),
        Pat::Type(t) => binds(&t.pat, name),
        _ => false,
    }
}

/// The usual ways to ask for the key that cannot work, with the fix: a borrowed
/// `IdempotencyKey` (the engine hands the handler its own, by value), and an argument
/// named `key` of a string type, which is not the header at all (`String` is Axum's
/// body-as-text extractor; `&str` and `Option<String>` are no extractor). Only the name
/// `key` is checked for strings: a `String` under any other name stays the body.
fn key_argument_mistake(arg: &PatType, args: &Args) -> Option<String> {
    let wanted = match args.key {
        Some((KeyPolicy::Optional, _)) => "Option<IdempotencyKey>",
        _ => "IdempotencyKey",
    };
    let ty = unparen(&arg.ty);
    let borrowed_key = match ty {
        Type::Reference(reference) => {
            is_idempotency_key(&reference.elem) || is_optional_key(&reference.elem)
        }
        _ => option_of(ty).is_some_and(
            |inner| matches!(unparen(inner), Type::Reference(r) if is_idempotency_key(&r.elem)),
        ),
    };
    if borrowed_key {
        let name = plain_name(&arg.pat).map_or_else(|| "key".to_owned(), ToString::to_string);
        return Some(format!(
            "take the key by value: `{name}: {wanted}`. The engine hands the handler its own \
             copy (an Axum handler's arguments are owned, never borrowed from the request); \
             clone it in the body if you need it twice"
        ));
    }
    if plain_name(&arg.pat).is_none_or(|name| name != "key") {
        return None;
    }
    let what = if is_string(ty) {
        "a `String` argument is the request body as text (Axum's `String` extractor), not \
         the `Idempotency-Key` header"
    } else if matches!(ty, Type::Reference(r) if is_str(&r.elem) || is_string(&r.elem))
        || option_of(ty).is_some_and(is_string)
    {
        "a string argument does not receive the `Idempotency-Key` header (and this one is \
         no Axum extractor)"
    } else {
        return None;
    };
    let use_of_it = match args.key {
        Some((KeyPolicy::Optional, _)) => "`None` when the request ran unprotected",
        _ => {
            "`key.as_str()` is the header's value, `key.derive(\"charge\")` a key for a \
              downstream call"
        }
    };
    Some(format!(
        "{what}: take `key: {wanted}`, the claimed key ({use_of_it}). To read the body as \
         text, name the argument otherwise, e.g. `body: String`"
    ))
}

/// `ty` without parentheses or invisible groups around it.
pub(crate) fn unparen(ty: &Type) -> &Type {
    match ty {
        Type::Group(group) => unparen(&group.elem),
        Type::Paren(paren) => unparen(&paren.elem),
        _ => ty,
    }
}

/// The `T` of `Option<T>` under any path.
fn option_of(ty: &Type) -> Option<&Type> {
    let Type::Path(path) = unparen(ty) else {
        return None;
    };
    let segment = path.path.segments.last()?;
    if path.qself.is_some() || segment.ident != "Option" {
        return None;
    }
    match &segment.arguments {
        syn::PathArguments::AngleBracketed(args) if args.args.len() == 1 => match &args.args[0] {
            syn::GenericArgument::Type(inner) => Some(inner),
            _ => None,
        },
        _ => None,
    }
}

/// Whether `ty` is the path type whose last segment is `name`, without generics.
fn is_plain_path(ty: &Type, name: &str) -> bool {
    match unparen(ty) {
        Type::Path(path) => {
            path.qself.is_none()
                && path
                    .path
                    .segments
                    .last()
                    .is_some_and(|segment| segment.ident == name && segment.arguments.is_none())
        }
        _ => false,
    }
}

/// `String` under any path.
fn is_string(ty: &Type) -> bool {
    is_plain_path(ty, "String")
}

/// `str`.
fn is_str(ty: &Type) -> bool {
    is_plain_path(ty, "str")
}

/// Classifies an argument by its type; a transaction taken other than by `&mut` is
/// refused (pushed onto `errors`) and treated as an extractor.
pub(crate) fn param_kind<'a>(ty: &'a Type, errors: &mut Vec<syn::Error>) -> ParamKind<'a> {
    if is_idempotency_key(ty) || is_optional_key(ty) {
        return ParamKind::Key;
    }
    match ty {
        Type::Reference(reference) if is_transaction(&reference.elem) => {
            if reference.mutability.is_some() {
                return ParamKind::Tx(&reference.elem);
            }
            errors.push(syn::Error::new_spanned(
                ty,
                format!(
                    "take the transaction by mutable reference: `&mut {}`",
                    type_to_string(&reference.elem)
                ),
            ));
        }
        _ if is_transaction(ty) => errors.push(syn::Error::new_spanned(
            ty,
            format!(
                "take the transaction by mutable reference: `&mut {}`; the engine keeps it to \
                 commit or roll back after the handler",
                type_to_string(ty)
            ),
        )),
        _ => {}
    }
    ParamKind::Extractor
}

/// `Tx<DB>` under any path (`Tx<Sqlite>`, `idempotent_runtime::Tx<Postgres>`).
pub(crate) fn is_transaction(ty: &Type) -> bool {
    match ty {
        Type::Path(path) if path.qself.is_none() => {
            path.path.segments.last().is_some_and(|segment| {
                segment.ident == "Tx"
                    && matches!(&segment.arguments, syn::PathArguments::AngleBracketed(args) if args.args.len() == 1)
            })
        }
        Type::Group(group) => is_transaction(&group.elem),
        Type::Paren(paren) => is_transaction(&paren.elem),
        _ => false,
    }
}

/// `IdempotencyKey` under any path (`IdempotencyKey`, `idempotent_runtime::IdempotencyKey`).
pub(crate) fn is_idempotency_key(ty: &Type) -> bool {
    match ty {
        Type::Path(path) => path.path.segments.last().is_some_and(|segment| {
            segment.ident == "IdempotencyKey" && segment.arguments.is_none()
        }),
        Type::Group(group) => is_idempotency_key(&group.elem),
        Type::Paren(paren) => is_idempotency_key(&paren.elem),
        _ => false,
    }
}

/// `Option<IdempotencyKey>` under any path (`Option<IdempotencyKey>`,
/// `std::option::Option<idempotent_runtime::IdempotencyKey>`).
pub(crate) fn is_optional_key(ty: &Type) -> bool {
    match ty {
        Type::Path(path) if path.qself.is_none() => {
            path.path.segments.last().is_some_and(|segment| {
                segment.ident == "Option"
                    && matches!(&segment.arguments, syn::PathArguments::AngleBracketed(args)
                        if args.args.len() == 1
                            && matches!(&args.args[0], syn::GenericArgument::Type(inner) if is_idempotency_key(inner)))
            })
        }
        Type::Group(group) => is_optional_key(&group.elem),
        Type::Paren(paren) => is_optional_key(&paren.elem),
        _ => false,
    }
}

/// The span of an `impl Trait` anywhere inside `ty`.
pub(crate) fn impl_trait_in(ty: &Type) -> Option<proc_macro2::Span> {
    impl_trait_where(ty, &|_| true)
}

/// The first `impl Trait` in `ty` whose bounds have no `use<…>` (precise capturing).
fn capturing_impl_trait_in(ty: &Type) -> Option<proc_macro2::Span> {
    impl_trait_where(ty, &|it| {
        !quote::ToTokens::to_token_stream(&it.bounds)
            .into_iter()
            .any(|tree| matches!(tree, proc_macro2::TokenTree::Ident(ident) if ident == "use"))
    })
}

fn impl_trait_where(
    ty: &Type,
    wanted: &dyn Fn(&syn::TypeImplTrait) -> bool,
) -> Option<proc_macro2::Span> {
    let impl_trait_in = |ty: &Type| impl_trait_where(ty, wanted);
    match ty {
        Type::ImplTrait(it) => wanted(it).then_some(it.impl_token.span),
        Type::Array(a) => impl_trait_in(&a.elem),
        Type::Group(g) => impl_trait_in(&g.elem),
        Type::Paren(p) => impl_trait_in(&p.elem),
        Type::Ptr(p) => impl_trait_in(&p.elem),
        Type::Reference(r) => impl_trait_in(&r.elem),
        Type::Slice(s) => impl_trait_in(&s.elem),
        Type::Tuple(t) => t.elems.iter().find_map(impl_trait_in),
        Type::Path(p) => p
            .path
            .segments
            .iter()
            .find_map(|segment| match &segment.arguments {
                syn::PathArguments::AngleBracketed(args) => {
                    args.args.iter().find_map(|arg| match arg {
                        syn::GenericArgument::Type(ty) => impl_trait_in(ty),
                        _ => None,
                    })
                }
                _ => None,
            }),
        _ => None,
    }
}

/// A type as a user would write it, for messages (`Json<Req>`, not `Json < Req >`).
pub(crate) fn type_to_string(ty: &Type) -> String {
    let text = ty.to_token_stream().to_string();
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        let prev = out.chars().last();
        let next = chars.peek().copied();
        let drop_space = c == ' '
            && (matches!(prev, Some('<' | ':' | '&' | '(' | '['))
                || matches!(next, Some('<' | '>' | ':' | ',' | ';' | ')' | ']')));
        if !drop_space {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_types_compactly() {
        let ty: Type = syn::parse_quote!(axum::extract::State<Arc<AppState>>);
        assert_eq!(type_to_string(&ty), "axum::extract::State<Arc<AppState>>");
        let ty: Type = syn::parse_quote!((Caller, &'static str, [u8; 4]));
        assert_eq!(type_to_string(&ty), "(Caller, &'static str, [u8; 4])");
    }

    #[test]
    fn recognises_the_key_argument() {
        assert!(is_idempotency_key(&syn::parse_quote!(IdempotencyKey)));
        assert!(is_idempotency_key(&syn::parse_quote!(
            idempotent_runtime::IdempotencyKey
        )));
        assert!(!is_idempotency_key(&syn::parse_quote!(
            Json<IdempotencyKey>
        )));
        assert!(is_optional_key(&syn::parse_quote!(Option<IdempotencyKey>)));
        assert!(is_optional_key(&syn::parse_quote!(
            std::option::Option<idempotent_runtime::IdempotencyKey>
        )));
        assert!(!is_optional_key(&syn::parse_quote!(Option<String>)));
        assert!(!is_optional_key(&syn::parse_quote!(IdempotencyKey)));
    }
}
