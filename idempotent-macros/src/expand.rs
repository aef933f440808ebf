//! Code generation: the handler becomes a wrapper that extracts everything, claims the key
//! and runs the original body (moved into an inner `async fn`) through the engine.
//!
//! ```text
//! pub async fn create(__arg0: Caller, __idem: Guard, __arg2: Hashed<Json<Req>>) -> Response {
//!     async fn create(caller: Caller, key: IdempotencyKey, Json(req): Json<Req>) -> R { body }
//!     const __CONFIG: HandlerConfig = HandlerConfig::new().ttl(Duration::from_secs(86400));
//!     let (__arg2, __fingerprint) = __arg2.into_parts(__CONFIG.fingerprint);
//!     let __scope = <Caller as Scope>::scope(&__arg0).into_owned();
//!     __idem.run(&__CONFIG, &__scope, __fingerprint, move |__key| create(__arg0, __key, __arg2)).await
//! }
//! ```
//!
//! The inner function keeps the handler's name, so diagnostics about its body and future
//! ("future returned by `create` is not `Send`") name the user's function.

use proc_macro2::{Delimiter, Group, Literal, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::ItemFn;
use syn::spanned::Spanned;

use crate::args::{self, Args, FingerprintMode, KeyPolicy, KeyShape, Mode, OnServerError};
use crate::consumer;
use crate::signature::{self, Handler, ParamKind};

/// Clippy's default `too_many_arguments` threshold.
const CLIPPY_MAX_ARGS: usize = 7;

/// The whole macro on `proc_macro2` streams: the expansion, or every error found with the
/// function kept (see [`refused`]), or the untouched item when it is no function.
pub(crate) fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut errors = Vec::new();
    let func: ItemFn = match syn::parse2(item.clone()) {
        Ok(func) => func,
        Err(_) => {
            // Parsed anyway, for the mistakes in the arguments.
            let _ = Args::parse_as(args, Mode::Handler, &mut errors);
            errors.push(syn::Error::new(
                Span::call_site(),
                "`#[idempotent]` goes on an `async fn`: an Axum handler, or a consumer \
                 function with `key = …`",
            ));
            return with_errors(item, errors);
        }
    };
    // A handler or a consumer function: `key = <expression>` (or the name of an argument)
    // makes a consumer function, and so does a function that says it is no handler (it
    // takes the engine); a handler keeps every reading it had (`key = optional`, and a
    // misspelt policy's error).
    let not_a_handler = consumer::not_a_handler(&func);
    let mode = match args::key_shape(&args) {
        KeyShape::Expression => Mode::Consumer,
        KeyShape::Name(name) if consumer::has_argument(&func, &name) => Mode::Consumer,
        _ if not_a_handler.is_some() => Mode::Consumer,
        _ => Mode::Handler,
    };
    let args = Args::parse_as(args, mode, &mut errors);
    if mode == Mode::Consumer {
        return consumer::expand(&args, &func, errors);
    }
    if not_a_handler.is_some() || args.payload.is_some() || args.engine.is_some() {
        // Meant as a consumer function, without its key: that one error, not a handler's
        // (a missing `scope = caller`, extractors).
        errors.push(consumer::missing_key(&func, &args, not_a_handler));
        return consumer::refused(&func, &errors);
    }
    match signature::check(&func, &args, &mut errors) {
        Some(handler) if errors.is_empty() => generate(&args, &handler),
        _ => refused(&func, errors),
    }
}

/// A refused handler: the function as written, renamed `<name>_as_written` (so its body
/// is still compiled and checked), and under its own name a stub without arguments,
/// which is a handler for any router state: `.route(.., post(name))` keeps compiling, and
/// the attribute's errors are the only ones.
fn refused(func: &ItemFn, errors: Vec<syn::Error>) -> TokenStream {
    let name = &func.sig.ident;
    let mut as_written = func.clone();
    as_written.sig.ident = format_ident!("{}_as_written", name, span = name.span());
    // `#[cfg]` so that the stub exists exactly when the function does; the docs for
    // `missing_docs`. Nothing else: e.g. `#[instrument(skip(caller))]` names arguments
    // the stub does not have.
    let kept = func
        .attrs
        .iter()
        .filter(|attr| attr.path().is_ident("cfg") || attr.path().is_ident("doc"));
    let vis = &func.vis;
    let errors = errors.iter().map(syn::Error::to_compile_error);
    quote! {
        #[allow(dead_code)]
        #as_written
        #(#kept)*
        #vis async fn #name() {}
        #(#errors)*
    }
}

/// The original item followed by the errors, for an item that is no function.
fn with_errors(item: TokenStream, errors: Vec<syn::Error>) -> TokenStream {
    let errors = errors.iter().map(syn::Error::to_compile_error);
    quote! {
        #item
        #(#errors)*
    }
}

fn generate(args: &Args, handler: &Handler<'_>) -> TokenStream {
    let krate = match &args.krate {
        Some(path) => quote!(#path),
        None => quote!(::idempotent_runtime),
    };
    let p = quote!(#krate::__private);
    let func = handler.func;
    // `#[tracing::instrument]` (after `#[idempotent]`) goes on the inner function, which
    // keeps the user's parameter names: `skip(caller)` and the recorded fields name
    // them, and the span covers exactly the handler's work. Every other attribute stays
    // on the wrapper (docs, lints, `#[cfg]`, …).
    let (inner_attrs, attrs): (Vec<_>, Vec<_>) = func.attrs.iter().partition(|attr| {
        attr.path()
            .segments
            .last()
            .is_some_and(|segment| segment.ident == "instrument")
    });
    let vis = &func.vis;
    let name = &func.sig.ident;
    // The user's own `async fn` tokens (see the braces below).
    let asyncness = &func.sig.asyncness;
    let fn_token = &func.sig.fn_token;
    let output = &func.sig.output;
    let block = &func.block;
    let inner_params = handler.params.iter().map(|param| param.arg);

    let arg_name = |index: usize| format_ident!("__arg{}", index);
    let last_extractor = handler.extractors().last().map(|(index, _)| index);
    let wraps_last = !handler.appends_unit_hash();

    // The wrapper's extractors: the user's, minus `IdempotencyKey`, the last in `Hashed`,
    // with the `Guard` right after the scope argument. Axum runs `FromRequestParts`
    // extractors in argument order: authentication rejects first (401 before a missing
    // key's 400), and the key is still checked before the body (always in the last
    // argument, never the scope's) is read and before the store is touched.
    // `Guard<true>` lets a request without a key through (`key = optional`) and hands the
    // handler `Option<IdempotencyKey>`.
    let guard = match args.key {
        Some((KeyPolicy::Optional, _)) => quote!(__idem: #p::Guard<true>),
        _ => quote!(__idem: #p::Guard),
    };
    let mut wrapper_params: Vec<TokenStream> = Vec::new();
    for (index, param) in handler.extractors() {
        let ident = arg_name(index);
        let ty = &param.arg.ty;
        if wraps_last && Some(index) == last_extractor {
            wrapper_params.push(quote!(#ident: #p::Hashed<#ty>));
        } else {
            wrapper_params.push(quote!(#ident: #ty));
        }
        if index == handler.scope {
            wrapper_params.push(guard.clone());
        }
    }
    let unhash = match last_extractor {
        Some(index) if wraps_last => {
            let ident = arg_name(index);
            quote!(let (#ident, __fingerprint) = #ident.into_parts(__CONFIG.fingerprint);)
        }
        _ => {
            wrapper_params.push(quote!(__hashed: #p::Hashed<()>));
            quote!(let ((), __fingerprint) = __hashed.into_parts(__CONFIG.fingerprint);)
        }
    };

    // `Scope` is checked on the argument's type: a missing impl is reported there.
    let scope_arg = arg_name(handler.scope);
    let scope_ty = &handler.params[handler.scope].arg.ty;
    let scope_fn = quote_spanned!(scope_ty.span()=> <#scope_ty as #p::Scope>::scope);

    let call_args = handler
        .params
        .iter()
        .enumerate()
        .map(|(index, param)| match param.kind {
            ParamKind::Extractor => {
                let ident = arg_name(index);
                quote!(#ident)
            }
            ParamKind::Key => quote!(__key),
            ParamKind::Tx(_) => quote!(&mut __tx),
        });
    let key_param = if handler
        .params
        .iter()
        .any(|param| matches!(param.kind, ParamKind::Key))
    {
        quote!(__key)
    } else {
        quote!(_)
    };
    let config = config(args, name, &p);
    // `policy = NAME` publishes the config as a `const` beside the handler, with its
    // visibility (and `#[cfg]`s), for code that documents it (OpenAPI); the wrapper then
    // reads that one constant, so what is published is what runs.
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
    // The engine's bounds (a `Send + 'static` future, an `IntoResponse` output) are
    // reported on the return type (or the name): that is what the user changes.
    let bound_span = match output {
        syn::ReturnType::Type(_, ty) => ty.span(),
        syn::ReturnType::Default => name.span(),
    };
    let run = match handler.transaction() {
        None => quote_spanned! {bound_span=>
            __idem
                .run(&__CONFIG, &__scope, __fingerprint, move |#key_param| #name(#(#call_args),*))
                .await
        },
        // The engine opens the transaction and gets it back with the handler's result, to
        // commit (with the stored response) or roll back.
        Some(tx) => quote_spanned! {bound_span=>
            __idem
                .run_in_transaction(
                    &__CONFIG,
                    &__scope,
                    __fingerprint,
                    move |#key_param, mut __tx: #tx| async move {
                        let __result = #name(#(#call_args),*).await;
                        (__result, __tx)
                    },
                )
                .await
        },
    };

    // Clippy counts the wrapper's arguments: when only the added `Guard`/`Hashed<()>` take
    // it over the default limit, that is not the user's doing. (Above the limit already,
    // the user's own `#[allow]` on the function covers the wrapper too.)
    let wrapper_count = wrapper_params.len();
    let user_count = handler.params.len();
    let allow_arity = (user_count <= CLIPPY_MAX_ARGS && wrapper_count > CLIPPY_MAX_ARGS)
        .then(|| quote!(#[allow(clippy::too_many_arguments)]));

    // `state = AppState`: a forgotten `impl FromRef<AppState> for Idempotency` is reported
    // on the attribute's `AppState`, naming the impl, besides Axum's "not a `Handler`".
    let state_check = args.state.as_ref().map(|state| {
        quote_spanned! {state.span()=>
            #p::check_state_gives_engine::<#state>();
        }
    });

    let body = quote! {
        #(#inner_attrs)*
        async fn #name(#(#inner_params),*) #output #block
        const __CONFIG: #p::HandlerConfig = #config;
        #state_check
        #unhash
        let __scope = #scope_fn(&#scope_arg).into_owned();
        #run
    };
    // The wrapper's braces are the user's: with the `async fn` tokens, they place the item
    // in user code, so rustc still reports an unused handler (`dead_code`).
    let mut body = Group::new(Delimiter::Brace, body);
    body.set_span(block.brace_token.span.join());

    quote! {
        #policy_item
        #(#attrs)*
        #allow_arity
        #vis #asyncness #fn_token #name(#(#wrapper_params),*) -> #p::Response
        #body
    }
}

/// The `const` handler configuration: only what the attribute sets, the rest is the
/// engine's default.
pub(crate) fn config(args: &Args, handler_name: &syn::Ident, p: &TokenStream) -> TokenStream {
    let name = handler_name.to_string();
    let mut config = quote! {
        #p::HandlerConfig::new()
            .name(::core::concat!(::core::module_path!(), "::", #name))
    };
    for (setter, duration) in [
        ("ttl", &args.ttl),
        ("lease", &args.lease),
        ("max_duration", &args.max_duration),
        ("wait", &args.wait),
    ] {
        if let Some(duration) = duration {
            let setter = format_ident!("{}", setter);
            let value = duration_tokens(duration.value, p);
            config.extend(quote!(.#setter(#value)));
        }
    }
    if let Some(policy) = args.on_server_error {
        let variant = match policy {
            OnServerError::Release => quote!(Release),
            OnServerError::Store => quote!(Store),
        };
        config.extend(quote!(.on_server_error(#p::OnServerError::#variant)));
    }
    if let Some(mode) = args.fingerprint {
        let variant = match mode {
            FingerprintMode::Raw => quote!(Raw),
            FingerprintMode::Json => quote!(Json),
        };
        config.extend(quote!(.fingerprint(#p::FingerprintMode::#variant)));
    }
    if let Some(names) = &args.exclude_headers {
        config.extend(quote!(.exclude_headers(&[#(#names),*])));
    }
    if let Some((KeyPolicy::Optional, _)) = args.key {
        config.extend(quote!(.key_optional()));
    }
    config
}

/// `Duration::from_secs(n)` when `duration` is whole seconds (what the docs show an
/// expansion as), else `Duration::from_millis(n)`: the grammar's smallest unit.
fn duration_tokens(duration: std::time::Duration, p: &TokenStream) -> TokenStream {
    if duration.subsec_millis() == 0 {
        let secs = Literal::u64_unsuffixed(duration.as_secs());
        quote!(#p::Duration::from_secs(#secs))
    } else {
        let millis =
            u64::try_from(duration.as_millis()).expect("the grammar counts milliseconds in a u64");
        let millis = Literal::u64_unsuffixed(millis);
        quote!(#p::Duration::from_millis(#millis))
    }
}
