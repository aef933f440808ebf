//! Snapshot tests of whole expansions (pretty-printed), successful and refused.

use proc_macro2::TokenStream;
use quote::quote;

/// Runs the macro and pretty-prints what it produced.
fn expand(args: TokenStream, item: TokenStream) -> String {
    let output = crate::expand::idempotent(args, item);
    let file: syn::File = syn::parse2(output.clone())
        .unwrap_or_else(|err| panic!("the expansion does not parse ({err}):\n{output}"));
    prettyplease::unparse(&file)
}

#[test]
fn full_handler_with_key_state_json_and_result() {
    let text = expand(
        quote!(ttl = "24h", scope = caller),
        quote! {
            /// Charges a card once per idempotency key.
            pub async fn create_payment(
                caller: Caller,
                key: IdempotencyKey,
                State(app): State<AppState>,
                Json(req): Json<ChargeRequest>,
            ) -> Result<(StatusCode, HeaderMap, Json<Payment>), ApiError> {
                let payment = app.gateway.charge(&caller, &req, &key.derive("charge")).await?;
                Ok((StatusCode::CREATED, HeaderMap::new(), Json(payment)))
            }
        },
    );
    insta::assert_snapshot!("full_handler", text);
}

#[test]
fn handler_without_body_gets_a_unit_hash() {
    let text = expand(
        quote!(scope = caller),
        quote! {
            async fn capture(caller: Caller, Path(id): Path<u64>) -> StatusCode {
                let _ = (caller, id);
                StatusCode::NO_CONTENT
            }
        },
    );
    insta::assert_snapshot!("path_only_no_body", text);
}

#[test]
fn every_option_and_a_renamed_crate() {
    let text = expand(
        quote! {
            scope = caller,
            ttl = "7d",
            lease = "1m30s",
            max_duration = "2m",
            wait = "5s",
            on_server_error = store,
            fingerprint = "json",
            exclude_headers = ["x-request-id", "x-ratelimit-remaining"],
            crate = "renamed::runtime",
        },
        quote! {
            pub(crate) async fn refund(
                Path(id): Path<String>,
                Query(q): Query<RefundQuery>,
                caller: Caller,
                Json(body): Json<Refund>,
            ) -> Json<Refunded> {
                Json(Refunded::new(caller, id, q, body))
            }
        },
    );
    insta::assert_snapshot!("every_option_renamed_crate", text);
}

#[test]
fn scope_last_and_impl_into_response() {
    let text = expand(
        quote!(scope = caller),
        quote! {
            #[allow(clippy::unused_async)]
            async fn touch(State(app): State<AppState>, caller: Caller) -> impl IntoResponse {
                app.touch(&caller);
                StatusCode::ACCEPTED
            }
        },
    );
    insta::assert_snapshot!("scope_last_impl_into_response", text);
}

#[test]
fn form_body_with_mut_patterns_and_only_scope_and_key() {
    let text = expand(
        quote!(scope = account, lease = "10s"),
        quote! {
            async fn subscribe(
                mut account: AccountId,
                key: idempotent_runtime::IdempotencyKey,
                Form(mut form): Form<Subscription>,
            ) -> Result<Redirect, AppError> {
                form.normalise();
                account.touch();
                Ok(Redirect::to(&format!("/subscriptions/{}", key.derive("subscription"))))
            }
        },
    );
    insta::assert_snapshot!("form_mut_patterns", text);
    let text = expand(
        quote!(scope = caller),
        quote! {
            async fn replay_me(caller: Caller, key: IdempotencyKey) -> String {
                key.derive(&caller.0)
            }
        },
    );
    insta::assert_snapshot!("scope_and_key_only", text);
}

#[test]
fn refused_signature_keeps_the_function() {
    let text = expand(
        quote!(),
        quote! {
            /// Not async, and no scope.
            pub fn create_payment<T>(&self, Caller(c): Caller, body: Json<T>) -> StatusCode {
                StatusCode::OK
            }
        },
    );
    insta::assert_snapshot!("error_signature", text);
}

#[test]
fn refused_arguments_are_all_reported() {
    let text = expand(
        quote! {
            scope = caler, tll = "1h", ttl = "0s", ttl = "1h", lease = "2h",
            on_server_error = retry, fingerprint = "xml", exclude_headers = ["X-Cost"],
        },
        quote! {
            async fn create(caller: Caller, Json(req): Json<Req>) -> StatusCode {
                StatusCode::OK
            }
        },
    );
    insta::assert_snapshot!("error_arguments", text);
}

#[test]
fn destructured_scope_and_duplicate_key_are_refused() {
    let text = expand(
        quote!(scope = c, lease = "10s", ttl = "10s"),
        quote! {
            async fn create(Caller(c): Caller, a: IdempotencyKey, b: IdempotencyKey) {}
        },
    );
    assert!(
        text.contains("names a binding inside a destructuring pattern"),
        "{text}"
    );
    assert!(text.contains("write `c: Caller`"), "{text}");
    assert!(
        text.contains("only one `IdempotencyKey` argument"),
        "{text}"
    );
    assert!(text.contains("must be shorter than"), "{text}");
}

#[test]
fn scope_naming_no_argument_suggests_one() {
    let text = expand(
        quote!(scope = calller),
        quote!(
            async fn create(caller: Caller, key: IdempotencyKey) {}
        ),
    );
    assert!(text.contains("did you mean `caller`?"), "{text}");
    let text = expand(
        quote!(scope = who),
        quote!(
            async fn create(caller: Caller, State(s): State<S>) {}
        ),
    );
    assert!(
        text.contains("its arguments with a plain name are `caller`"),
        "{text}"
    );
    let text = expand(
        quote!(scope = key),
        quote!(
            async fn create(key: IdempotencyKey) {}
        ),
    );
    assert!(
        text.contains("names the `IdempotencyKey` argument"),
        "{text}"
    );
}

#[test]
fn misplaced_attribute_is_refused() {
    let text = expand(
        quote!(scope = caller),
        quote!(
            struct Caller;
        ),
    );
    assert!(text.contains("struct Caller;"), "{text}");
    assert!(
        text.contains("goes on an `async fn`: an Axum handler, or a consumer function"),
        "{text}"
    );
}

#[test]
fn too_many_arguments_are_refused() {
    let args: Vec<TokenStream> = (0..16_usize)
        .map(|i| {
            let name = quote::format_ident!("a{}", i);
            quote!(#name: Header)
        })
        .collect();
    let text = expand(quote!(scope = a0), quote!(async fn wide(#(#args),*) {}));
    assert!(text.contains("at most 16 arguments"), "{text}");
    let text = expand(
        quote!(scope = a0),
        quote!(async fn wide(#(#args),*, key: IdempotencyKey) {}),
    );
    assert!(text.contains("at most 16 arguments"), "{text}");
    let fifteen = &args[..15];
    let text = expand(quote!(scope = a0), quote!(async fn wide(#(#fifteen),*) {}));
    assert!(!text.contains("compile_error"), "{text}");
}

#[test]
fn added_arguments_do_not_trip_clippy_arity() {
    let text = expand(
        quote!(scope = caller),
        quote! {
            async fn wide(
                caller: Caller,
                State(app): State<AppState>,
                Path(id): Path<u64>,
                method: Method,
                uri: Uri,
                headers: HeaderMap,
                Json(body): Json<Body>,
            ) -> StatusCode {
                app.handle(caller, id, method, uri, headers, body)
            }
        },
    );
    insta::assert_snapshot!("seven_arguments_allow_arity", text);
}

#[test]
fn transactional_handler_runs_in_a_transaction() {
    let text = expand(
        quote!(scope = caller, ttl = "24h"),
        quote! {
            /// Deposits; the ledger row and the stored response commit together.
            pub async fn deposit(
                caller: Caller,
                key: IdempotencyKey,
                tx: &mut Tx<Sqlite>,
                Json(request): Json<DepositRequest>,
            ) -> Result<Response, ApiError> {
                sqlx::query(INSERT).bind(caller.account()).bind(request.amount).execute(tx.conn()).await?;
                Ok(created(key))
            }
        },
    );
    insta::assert_snapshot!("transactional_handler", text);
}

#[test]
fn transaction_arguments_are_checked() {
    let text = expand(
        quote!(scope = caller),
        quote! {
            async fn deposit(caller: Caller, tx: Tx<Sqlite>, other: &Tx<Sqlite>, t: &mut Tx<Postgres>, u: &mut Tx<Sqlite>) {}
        },
    );
    assert!(
        text.contains(
            "take the transaction by mutable reference: `&mut Tx<Sqlite>`; the engine keeps it"
        ),
        "{text}"
    );
    assert!(
        text.contains("take the transaction by mutable reference: `&mut Tx<Sqlite>`\""),
        "{text}"
    );
    assert!(
        text.contains("only one transaction argument is allowed"),
        "{text}"
    );
    let text = expand(
        quote!(scope = tx),
        quote!(
            async fn deposit(tx: &mut Tx<Sqlite>) {}
        ),
    );
    assert!(
        text.contains("`scope = tx` names the transaction"),
        "{text}"
    );
}

#[test]
fn transactional_handler_cannot_store_server_errors() {
    let text = expand(
        quote!(scope = caller, on_server_error = store),
        quote! {
            async fn deposit(caller: Caller, tx: &mut Tx<Sqlite>) -> Result<StatusCode, StatusCode> {
                Ok(StatusCode::CREATED)
            }
        },
    );
    assert!(
        text.contains("a transactional handler always rolls back and releases on a 5xx"),
        "{text}"
    );
    // The function is kept as written, renamed, next to the error.
    assert!(
        text.contains(
            "async fn deposit_as_written(\n    caller: Caller,\n    tx: &mut Tx<Sqlite>,"
        ),
        "{text}"
    );
    // `release` is what a transactional handler does anyway: accepted.
    let text = expand(
        quote!(scope = caller, on_server_error = release),
        quote! {
            async fn deposit(caller: Caller, tx: &mut Tx<Sqlite>) -> Result<StatusCode, StatusCode> {
                Ok(StatusCode::CREATED)
            }
        },
    );
    assert!(!text.contains("compile_error"), "{text}");
}

#[test]
fn optional_key_hands_the_handler_an_option() {
    let text = expand(
        quote!(scope = caller, key = optional),
        quote! {
            /// Rolled out gradually: clients without a key still get through.
            pub async fn create_payment(
                caller: Caller,
                key: Option<IdempotencyKey>,
                State(app): State<AppState>,
                Json(req): Json<ChargeRequest>,
            ) -> Result<(StatusCode, Json<Payment>), ApiError> {
                let downstream = key.map(|key| key.derive("charge"));
                let payment = app.gateway.charge(&caller, &req, downstream.as_deref()).await?;
                Ok((StatusCode::CREATED, Json(payment)))
            }
        },
    );
    insta::assert_snapshot!("optional_key", text);
    let text = expand(
        quote!(scope = caller, key = optional),
        quote! {
            async fn ping(caller: Caller) -> StatusCode {
                let _ = caller;
                StatusCode::NO_CONTENT
            }
        },
    );
    assert!(
        text.contains("__idem: ::idempotent_runtime::__private::Guard<true>"),
        "{text}"
    );
    assert!(text.contains("move |_| ping(__arg0)"), "{text}");
    // `key = required` is the default, spelled out.
    let text = expand(
        quote!(scope = caller, key = required),
        quote!(
            async fn ping(caller: Caller, key: IdempotencyKey) {}
        ),
    );
    assert!(
        text.contains("__idem: ::idempotent_runtime::__private::Guard,"),
        "{text}"
    );
    assert!(!text.contains("compile_error"), "{text}");
}

#[test]
fn key_policy_and_key_argument_must_agree() {
    let text = expand(
        quote!(scope = caller, key = optional),
        quote!(
            async fn create(caller: Caller, key: IdempotencyKey) {}
        ),
    );
    assert!(
        text.contains("take `Option<IdempotencyKey>` (`None` when it ran unprotected)"),
        "{text}"
    );
    let text = expand(
        quote!(scope = caller),
        quote!(
            async fn create(caller: Caller, key: Option<IdempotencyKey>) {}
        ),
    );
    assert!(
        text.contains("`Option<IdempotencyKey>` goes with `key = optional`"),
        "{text}"
    );
    let text = expand(
        quote!(scope = caller, key = optional),
        quote!(
            async fn deposit(
                caller: Caller,
                tx: &mut Tx<Sqlite>,
            ) -> Result<StatusCode, StatusCode> {
                Ok(StatusCode::CREATED)
            }
        ),
    );
    assert!(
        text.contains("`key = optional` is not supported on a transactional handler"),
        "{text}"
    );
}

#[test]
fn key_taken_as_a_string_or_by_reference_is_refused() {
    for (args, arg, wanted) in [
        (
            quote!(scope = caller),
            quote!(key: String),
            "take `key: IdempotencyKey`",
        ),
        (
            quote!(scope = caller),
            quote!(mut key: std::string::String),
            "take `key: IdempotencyKey`",
        ),
        (
            quote!(scope = caller),
            quote!(key: &str),
            "take `key: IdempotencyKey`",
        ),
        (
            quote!(scope = caller),
            quote!(key: Option<String>),
            "take `key: IdempotencyKey`",
        ),
        (
            quote!(scope = caller, key = optional),
            quote!(key: String),
            "take `key: Option<IdempotencyKey>`",
        ),
        (
            quote!(scope = caller),
            quote!(key: &IdempotencyKey),
            "take the key by value: `key: IdempotencyKey`",
        ),
        (
            quote!(scope = caller),
            quote!(k: &mut IdempotencyKey),
            "take the key by value: `k: IdempotencyKey`",
        ),
        (
            quote!(scope = caller, key = optional),
            quote!(key: Option<&IdempotencyKey>),
            "take the key by value: `key: Option<IdempotencyKey>`",
        ),
        (
            quote!(scope = caller, key = optional),
            quote!(key: &Option<IdempotencyKey>),
            "take the key by value: `key: Option<IdempotencyKey>`",
        ),
    ] {
        let text = expand(args, quote!(async fn create(caller: Caller, #arg) {}));
        assert!(text.contains(wanted), "{arg}: {text}");
    }
    let text = expand(
        quote!(scope = caller),
        quote!(
            async fn create(caller: Caller, key: String) {}
        ),
    );
    assert!(text.contains("is the request body as text"), "{text}");
    // A string under another name is the body, as in any Axum handler; and `key` of
    // another type is whatever extractor that type is.
    for arg in [
        quote!(body: String),
        quote!(key: Json<Key>),
        quote!(key: Path<String>),
    ] {
        let text = expand(
            quote!(scope = caller),
            quote!(async fn create(caller: Caller, #arg) {}),
        );
        assert!(!text.contains("compile_error"), "{arg}: {text}");
    }
}

#[test]
fn refused_handler_is_kept_and_its_name_is_a_stub() {
    let text = expand(
        quote!(scope = caller),
        quote! {
            /// Creates a note.
            #[cfg(feature = "notes")]
            #[tracing::instrument(skip(caller))]
            pub(crate) async fn create(caller: Caller, key: String) -> StatusCode {
                StatusCode::CREATED
            }
        },
    );
    insta::assert_snapshot!("error_keeps_function_and_stubs_name", text);
}

#[test]
fn policy_publishes_the_config_as_a_constant() {
    let text = expand(
        quote!(
            scope = caller,
            ttl = "2h",
            key = optional,
            policy = CREATE_PAYMENT_POLICY
        ),
        quote! {
            /// Charges once per key.
            #[cfg(feature = "payments")]
            pub(crate) async fn create_payment(
                caller: Caller,
                key: Option<IdempotencyKey>,
                Json(req): Json<ChargeRequest>,
            ) -> StatusCode {
                let _ = (caller, key, req);
                StatusCode::CREATED
            }
        },
    );
    insta::assert_snapshot!("policy_constant", text);
    // The policy must be a plain name.
    for (value, message) in [
        (
            quote!("CREATE_PAYMENT_POLICY"),
            "write `policy = CREATE_PAYMENT_POLICY` without quotes",
        ),
        (
            quote!(crate::POLICY),
            "`policy` takes the name of a constant to define",
        ),
    ] {
        let text = expand(
            quote!(scope = caller, policy = #value),
            quote!(
                async fn create(caller: Caller) {}
            ),
        );
        assert!(text.contains(message), "{text}");
    }
}

#[test]
fn a_named_state_is_checked_to_give_the_engine() {
    let text = expand(
        quote!(scope = caller, state = AppState),
        quote! {
            async fn create(caller: Caller, State(app): State<AppState>) -> StatusCode {
                let _ = (caller, app);
                StatusCode::CREATED
            }
        },
    );
    assert!(
        text.contains("::idempotent_runtime::__private::check_state_gives_engine::<AppState>();"),
        "{text}"
    );
    let unnamed = expand(
        quote!(scope = caller),
        quote!(
            async fn create(caller: Caller) {}
        ),
    );
    assert!(!unnamed.contains("check_state_gives_engine"), "{unnamed}");
}

#[test]
fn sub_second_durations_expand_to_milliseconds() {
    let text = expand(
        quote!(scope = caller, ttl = "1h 30m", lease = "1s500ms"),
        quote!(
            async fn create(caller: Caller) {}
        ),
    );
    assert!(
        text.contains(".ttl(::idempotent_runtime::__private::Duration::from_secs(5400))")
            && text
                .contains(".lease(::idempotent_runtime::__private::Duration::from_millis(1500))"),
        "{text}"
    );
}

#[test]
fn consumer_function_with_engine_argument_and_key() {
    let text = expand(
        quote!(key = order.id, scope = "orders", ttl = "24h"),
        quote! {
            /// Charges an order once per order id.
            pub async fn charge(
                idempotency: &Idempotency,
                mut order: Order,
                key: IdempotencyKey,
            ) -> Result<Receipt, ChargeError> {
                order.attempts += 1;
                gateway::charge(&order, &key.derive("gateway")).await
            }
        },
    );
    insta::assert_snapshot!("consumer_function", text);
}

#[test]
fn consumer_function_with_engine_expression_payload_and_transaction() {
    let text = expand(
        quote! {
            key = command.message_id(), scope = command.tenant, payload = command.body,
            engine = app.idempotency, lease = "10s", policy = LEDGER_POLICY, crate = "renamed",
        },
        quote! {
            #[tracing::instrument(skip(app))]
            async fn record(app: App, command: Command, tx: &mut Tx<Sqlite>) -> Result<u64, sqlx::Error> {
                app.ledger.insert(tx, &command.body).await
            }
        },
    );
    insta::assert_snapshot!("consumer_function_transactional", text);
}

#[test]
fn consumer_function_refused_is_kept_as_written() {
    let text = expand(
        quote!(scope = "orders"),
        quote! {
            async fn charge(idempotency: &Idempotency, order: Order) -> Result<Receipt, ChargeError> {
                todo!()
            }
        },
    );
    insta::assert_snapshot!("consumer_function_refused", text);
}
