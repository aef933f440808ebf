//! Messages per second through a NATS JetStream consumer that writes one ledger row per
//! charge command: bare (the loop a consumer without idempotency runs) against the same
//! loop through `JetStreamDoor::handle_in_transaction` (the row commits with the
//! message's record: the inbox), on SQLite and on Postgres, all in one run.
//!
//! Each repetition publishes the same messages to a fresh in-memory stream — mostly fresh
//! charge ids, some repeats of an id seen a while earlier (a producer's retry) — then
//! consumes them all with `--concurrency` messages in flight and times it from the first
//! pull to the last acknowledgement. Variants take turns within a repetition, so a drift
//! of the machine hits them all alike. See README.md here.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer::pull, stream};
use futures_util::StreamExt;
use idempotent_runtime::doors::nats::{JetStreamDoor, Reply};
use idempotent_runtime::store::{PostgresStore, SqliteStore};
use idempotent_runtime::transaction::{Tx, TxDatabase};
use idempotent_runtime::{HandlerConfig, Idempotency};
use sqlx::{Connection, Database, Pool, Postgres, Sqlite};

/// The header a charge's id travels in: not `Nats-Msg-Id`, which JetStream itself would
/// dedupe at publish, so the repeats reach the consumer as a producer's retries do.
const KEY_HEADER: &str = "Charge-Id";

/// The Postgres schema the benchmark's store and ledger live in; dropped each repetition.
const POSTGRES_SCHEMA: &str = "idempotent_consumer_bench";

/// The ledger table, in the database's default schema (Postgres: beside the store's
/// schema, not in it); dropped and created again each repetition.
const LEDGER: &str = "idempotent_consumer_bench_ledger";

/// `INSERT` of one ledger row (`$n` placeholders: SQLite takes them too).
const INSERT_ROW: &str =
    "INSERT INTO idempotent_consumer_bench_ledger (charge, cents) VALUES ($1, $2)";

/// Where the ledger and the idempotency records live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Backend {
    Sqlite,
    Postgres,
}

/// How a message reaches its ledger row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Consumer {
    /// No engine: the row, then the acknowledgement (a redelivery writes it again).
    Bare,
    /// Through the door (`handle`), the row written on the pool after the claim: once per
    /// charge unless a crash falls between the row and the record.
    Door,
    /// Through the door's inbox (`handle_in_transaction`): the row commits with the record.
    Inbox,
}

/// One row of the table: a backend and how the consumer writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Variant {
    backend: Backend,
    consumer: Consumer,
}

impl Variant {
    fn name(self) -> String {
        let backend = match self.backend {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        };
        let consumer = match self.consumer {
            Consumer::Bare => "bare",
            Consumer::Door => "door",
            Consumer::Inbox => "inbox",
        };
        format!("{consumer}-{backend}")
    }

    fn parse(name: &str) -> Result<Self, String> {
        let (consumer, backend) = name
            .split_once('-')
            .ok_or_else(|| format!("unknown variant {name:?}"))?;
        let consumer = match consumer {
            "bare" => Consumer::Bare,
            "door" => Consumer::Door,
            "inbox" => Consumer::Inbox,
            _ => return Err(format!("unknown variant {name:?}")),
        };
        let backend = match backend {
            "sqlite" => Backend::Sqlite,
            "postgres" => Backend::Postgres,
            _ => return Err(format!("unknown variant {name:?}")),
        };
        Ok(Self { backend, consumer })
    }
}

/// The command line (each flag also read from its `BENCH_*` environment variable).
#[derive(Debug)]
struct Args {
    messages: usize,
    reps: usize,
    retry_percent: usize,
    concurrency: usize,
    variants: Vec<Variant>,
    nats_url: String,
    postgres_url: String,
}

const USAGE: &str = "usage: idempotent-consumer-bench [--messages N] [--reps N] [--retries PERCENT] \
[--concurrency N] [--variants bare-sqlite,door-sqlite,inbox-sqlite,bare-postgres,door-postgres,inbox-postgres]";

impl Args {
    fn parse() -> Result<Self, String> {
        let env =
            |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
        let mut flags: BTreeMap<String, String> = BTreeMap::new();
        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            if flag == "--help" || flag == "-h" {
                return Err(USAGE.into());
            }
            let value = args
                .next()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
            flags.insert(flag, value);
        }
        let mut take = |flag: &str, var: &str, default: &str| {
            flags.remove(flag).unwrap_or_else(|| env(var, default))
        };
        let number = |text: String, flag: &str| {
            text.parse::<usize>()
                .map_err(|e| format!("{flag}: {e}\n{USAGE}"))
        };
        let messages = number(take("--messages", "BENCH_MESSAGES", "20000"), "--messages")?;
        let reps = number(take("--reps", "BENCH_REPS", "3"), "--reps")?;
        let retry_percent = number(take("--retries", "BENCH_RETRIES", "10"), "--retries")?;
        let concurrency = number(
            take("--concurrency", "BENCH_CONCURRENCY", "64"),
            "--concurrency",
        )?;
        let variants = take(
            "--variants",
            "BENCH_VARIANTS",
            "bare-sqlite,door-sqlite,inbox-sqlite,bare-postgres,door-postgres,inbox-postgres",
        )
        .split(',')
        .map(Variant::parse)
        .collect::<Result<Vec<_>, _>>()?;
        if let Some(flag) = flags.keys().next() {
            return Err(format!("unknown flag {flag}\n{USAGE}"));
        }
        if retry_percent > 50 || messages == 0 || reps == 0 || concurrency == 0 {
            return Err(format!(
                "--retries at most 50, the others at least 1\n{USAGE}"
            ));
        }
        Ok(Self {
            messages,
            reps,
            retry_percent,
            concurrency,
            variants,
            nats_url: env("IDEMPOTENT_BENCH_NATS_URL", "nats://127.0.0.1:4222"),
            postgres_url: env(
                "IDEMPOTENT_BENCH_POSTGRES_URL",
                "postgres://postgres@127.0.0.1:5432/test",
            ),
        })
    }
}

/// The charge ids in publishing order: index `i` is charge `i`, except every
/// `100 / retry_percent`-th message from the 2,000th on, which repeats a charge published
/// 1,000 to 2,000 messages earlier (long finished by then: a retry, not a race).
fn charge_ids(messages: usize, retry_percent: usize) -> Vec<usize> {
    let every = 100usize.checked_div(retry_percent).unwrap_or(usize::MAX);
    (0..messages)
        .map(|i| {
            if i >= 2_000 && i % every == 0 {
                i - 1_000 - (i * 7_919) % 1_000
            } else {
                i
            }
        })
        .collect()
}

/// What one repetition of one variant measured.
#[derive(Debug)]
struct Measured {
    per_second: f64,
    rows: i64,
    distinct_charges: i64,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = match Args::parse() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return std::process::ExitCode::from(2);
        }
    };
    let client = match async_nats::connect(&args.nats_url).await {
        Ok(client) => client,
        Err(e) => {
            eprintln!("nats at {}: {e}", args.nats_url);
            return std::process::ExitCode::FAILURE;
        }
    };
    let jetstream = jetstream::new(client);
    let ids = charge_ids(args.messages, args.retry_percent);
    let distinct = {
        let mut seen = ids.clone();
        seen.sort_unstable();
        seen.dedup();
        seen.len()
    };
    eprintln!(
        "{} messages ({} distinct charges), {} in flight, {} repetitions",
        ids.len(),
        distinct,
        args.concurrency,
        args.reps
    );

    let mut results: BTreeMap<Variant, Vec<f64>> = BTreeMap::new();
    let mut skipped: BTreeMap<Variant, String> = BTreeMap::new();
    let mut rows: BTreeMap<Variant, (i64, i64)> = BTreeMap::new();
    for rep in 0..args.reps {
        for &variant in &args.variants {
            if skipped.contains_key(&variant) {
                continue;
            }
            match run(&args, &jetstream, &ids, variant, rep).await {
                Ok(measured) => {
                    eprintln!(
                        "rep {rep} {:<20} {:>9.0} msg/s  ledger rows {} ({} distinct)",
                        variant.name(),
                        measured.per_second,
                        measured.rows,
                        measured.distinct_charges
                    );
                    results
                        .entry(variant)
                        .or_default()
                        .push(measured.per_second);
                    rows.insert(variant, (measured.rows, measured.distinct_charges));
                }
                Err(reason) => {
                    eprintln!("{}: skipped: {reason}", variant.name());
                    skipped.insert(variant, reason);
                }
            }
        }
    }
    print_table(&args, &results, &rows, &skipped, distinct);
    std::process::ExitCode::SUCCESS
}

/// Prints the markdown table: the median of each variant and its ratio to the bare
/// consumer on the same backend, measured in the same run.
fn print_table(
    args: &Args,
    results: &BTreeMap<Variant, Vec<f64>>,
    rows: &BTreeMap<Variant, (i64, i64)>,
    skipped: &BTreeMap<Variant, String>,
    distinct: usize,
) {
    let median = |values: &[f64]| {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        sorted[sorted.len() / 2]
    };
    println!(
        "{} messages, {}% repeats ({distinct} distinct charges), {} in flight; median of {} repetitions",
        args.messages, args.retry_percent, args.concurrency, args.reps
    );
    println!();
    println!(
        "| variant | messages/s (median) | × bare, same backend | runs (messages/s) | ledger rows (distinct charges), last run |"
    );
    println!("|---|---:|---:|---|---|");
    for &variant in &args.variants {
        if let Some(reason) = skipped.get(&variant) {
            println!("| {} | skipped: {reason} | | | |", variant.name());
            continue;
        }
        let Some(values) = results.get(&variant) else {
            continue;
        };
        let bare = Variant {
            consumer: Consumer::Bare,
            ..variant
        };
        let ratio = results
            .get(&bare)
            .map(|bare| format!("{:.2}", median(values) / median(bare)))
            .unwrap_or_default();
        let runs: Vec<String> = values.iter().map(|v| format!("{v:.0}")).collect();
        let (rows, distinct) = rows.get(&variant).copied().unwrap_or_default();
        println!(
            "| {} | {:.0} | {ratio} | {} | {rows} ({distinct}) |",
            variant.name(),
            median(values),
            runs.join(", ")
        );
    }
}

/// One repetition of one variant: a fresh stream and a fresh store, every message
/// published, then consumed and timed.
async fn run(
    args: &Args,
    jetstream: &jetstream::Context,
    ids: &[usize],
    variant: Variant,
    rep: usize,
) -> Result<Measured, String> {
    let name = format!(
        "BENCH_{}_{}_{rep}",
        variant.name().replace('-', "_"),
        std::process::id()
    );
    let subject = format!("bench.{name}");
    let stream = jetstream
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            storage: stream::StorageType::Memory,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("creating stream {name}: {e}"))?;
    publish(jetstream, &subject, ids).await?;
    let consumer = stream
        .create_consumer(pull::Config {
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(60),
            max_ack_pending: i64::try_from(args.concurrency * 4).unwrap_or(i64::MAX),
            ..Default::default()
        })
        .await
        .map_err(|e| format!("creating the consumer: {e}"))?;
    let measured = match variant.backend {
        Backend::Sqlite => {
            let dir = std::env::temp_dir()
                .join(format!("idempotent-consumer-bench-{}", std::process::id()));
            std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            let path = dir.join(format!("{name}.db"));
            let store = SqliteStore::connect(path.to_str().ok_or("temp dir is not UTF-8")?)
                .await
                .map_err(|e| format!("sqlite: {e}"))?;
            let pool = store.pool().clone();
            let measured =
                consume::<Sqlite>(args, &consumer, variant, Idempotency::new(store), pool).await;
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
            measured
        }
        Backend::Postgres => {
            let mut conn = sqlx::PgConnection::connect(&args.postgres_url)
                .await
                .map_err(|e| format!("postgres: {e}"))?;
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP SCHEMA IF EXISTS {POSTGRES_SCHEMA} CASCADE"
            )))
            .execute(&mut conn)
            .await
            .map_err(|e| format!("postgres: {e}"))?;
            let _ = conn.close().await;
            let store = PostgresStore::connect_in_schema(&args.postgres_url, POSTGRES_SCHEMA)
                .await
                .map_err(|e| format!("postgres: {e}"))?;
            let pool = store.pool().clone();
            consume::<Postgres>(args, &consumer, variant, Idempotency::new(store), pool).await
        }
    };
    let _ = jetstream.delete_stream(&name).await;
    measured
}

/// Publishes one message per id, awaiting JetStream's confirmations in batches.
async fn publish(
    jetstream: &jetstream::Context,
    subject: &str,
    ids: &[usize],
) -> Result<(), String> {
    for chunk in ids.chunks(1_000) {
        let mut acks = Vec::with_capacity(chunk.len());
        for &id in chunk {
            let mut headers = HeaderMap::new();
            headers.insert(KEY_HEADER, format!("charge-{id}").as_str());
            let payload = format!("{{\"cents\":{}}}", 100 + id % 9_900);
            let ack = jetstream
                .publish_with_headers(subject.to_owned(), headers, payload.into())
                .await
                .map_err(|e| format!("publishing: {e}"))?;
            acks.push(ack);
        }
        for ack in acks {
            ack.await
                .map_err(|e| format!("publish not confirmed: {e}"))?;
        }
    }
    Ok(())
}

/// Consumes every message of `consumer` and times it, then counts the ledger's rows.
async fn consume<DB>(
    args: &Args,
    consumer: &jetstream::consumer::Consumer<pull::Config>,
    variant: Variant,
    idempotency: Idempotency,
    pool: Pool<DB>,
) -> Result<Measured, String>
where
    DB: TxDatabase,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'c> &'c Pool<DB>: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'r> i64: sqlx::Decode<'r, DB>,
    for<'r> (i64, i64): sqlx::FromRow<'r, <DB as Database>::Row>,
    usize: sqlx::ColumnIndex<<DB as Database>::Row>,
{
    for statement in [
        format!("DROP TABLE IF EXISTS {LEDGER}"),
        format!("CREATE TABLE {LEDGER} (charge TEXT NOT NULL, cents BIGINT NOT NULL)"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .execute(&pool)
            .await
            .map_err(|e| format!("creating the ledger: {e}"))?;
    }
    let door = JetStreamDoor::new(idempotency)
        .config(HandlerConfig::new().name("charge"))
        .key_header(KEY_HEADER)
        .concurrency(args.concurrency);
    let acknowledged = Arc::new(AtomicUsize::new(0));
    let messages = consumer
        .messages()
        .await
        .map_err(|e| format!("opening the consumer's messages: {e}"))?;
    let started = Instant::now();
    let all = args.messages;
    let consumed = messages.for_each_concurrent(args.concurrency, |message| {
        let (door, pool, acknowledged) = (&door, &pool, &acknowledged);
        async move {
            let Ok(message) = message else { return };
            let acked = match variant.consumer {
                Consumer::Bare => bare(pool, message).await,
                Consumer::Door => {
                    let pool = pool.clone();
                    let handled = door
                        .handle(message, |key, message| async move {
                            let cents = cents_of(&message.payload);
                            sqlx::query::<DB>(INSERT_ROW)
                                .bind(key.as_str().to_owned())
                                .bind(cents)
                                .execute(&pool)
                                .await
                                .map(|_| cents)
                        })
                        .await;
                    matches!(handled.map(|handled| handled.reply()), Ok(Reply::Ack))
                }
                Consumer::Inbox => {
                    let handled = door
                        .handle_in_transaction(message, async |key, message, tx: &mut Tx<DB>| {
                            let cents = cents_of(&message.payload);
                            sqlx::query::<DB>(INSERT_ROW)
                                .bind(key.as_str().to_owned())
                                .bind(cents)
                                .execute(tx.conn())
                                .await
                                .map(|_| cents)
                        })
                        .await;
                    matches!(handled.map(|handled| handled.reply()), Ok(Reply::Ack))
                }
            };
            if acked {
                acknowledged.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    let done = async {
        while acknowledged.load(Ordering::Relaxed) < all {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::select! {
        () = consumed => return Err("the consumer's message stream ended".into()),
        () = done => {}
    }
    let elapsed = started.elapsed();
    let (rows, distinct_charges): (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT COUNT(*), COUNT(DISTINCT charge) FROM {LEDGER}"
    )))
    .fetch_one(&pool)
    .await
    .map_err(|e| format!("counting the ledger: {e}"))?;
    Ok(Measured {
        per_second: all as f64 / elapsed.as_secs_f64(),
        rows,
        distinct_charges,
    })
}

/// The bare consumer: the row, then the same confirmed acknowledgement the door sends.
async fn bare<DB>(pool: &Pool<DB>, message: jetstream::Message) -> bool
where
    DB: Database,
    for<'c> &'c Pool<DB>: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    let charge = message
        .headers
        .as_ref()
        .and_then(|headers| headers.get(KEY_HEADER))
        .map(|id| id.as_str().to_owned())
        .unwrap_or_default();
    let written = sqlx::query::<DB>(INSERT_ROW)
        .bind(charge)
        .bind(cents_of(&message.payload))
        .execute(pool)
        .await;
    written.is_ok() && message.double_ack().await.is_ok()
}

/// The amount of a `{"cents":N}` payload (0 when it is not one).
fn cents_of(payload: &[u8]) -> i64 {
    std::str::from_utf8(payload)
        .ok()
        .and_then(|text| text.strip_prefix("{\"cents\":"))
        .and_then(|rest| rest.strip_suffix('}'))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}
