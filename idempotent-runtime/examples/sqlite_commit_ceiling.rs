//! The ceiling of `SqliteStore`'s fresh-key writes on this machine's disk, without the
//! store, the engine or HTTP: the statements a fresh key costs (the claim's read, its
//! insert, the completion's update), run in a raw sqlx loop on one connection, at
//! `synchronous = NORMAL` and `FULL`, either one transaction per statement (how every
//! write committed before group commit) or in batches of 64 per transaction (as the
//! group-commit writer runs them).
//!
//! ```sh
//! cargo run --release -p idempotent-runtime --example sqlite_commit_ceiling [keys]
//! ```
//!
//! It prints fresh keys per second for each combination: what the HTTP benchmark's
//! fresh-key rate can never exceed, whatever the layer above does.

use std::time::Instant;

use idempotent_runtime::store::SqliteStore;
use sqlx::sqlite::SqliteSynchronous;
use sqlx::{Connection, SqliteConnection};

const BATCH: usize = 64;

const READ: &str = "SELECT state FROM idempotency_records WHERE scope = ?1 AND key = ?2";
const INSERT: &str = "INSERT INTO idempotency_records \
    (scope, key, fingerprint, fingerprint_version, state, token, lease_expires_at, \
     status, headers, body, created_at, expires_at) \
    VALUES (?1, ?2, ?3, 1, 'in_progress', ?4, 30000, NULL, NULL, NULL, 0, 3600000) \
    ON CONFLICT (scope, key) DO NOTHING";
const COMPLETE: &str = "UPDATE idempotency_records \
    SET state = 'completed', lease_expires_at = NULL, status = 201, headers = ?4, body = ?5 \
    WHERE scope = ?1 AND key = ?2 AND token = ?3 AND state = 'in_progress'";

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let keys: usize = std::env::args()
        .nth(1)
        .map(|n| n.parse())
        .transpose()?
        .unwrap_or(20_000);
    let dir = tempfile::tempdir()?;
    println!("fresh keys per second, {keys} keys per run, one connection:");
    for sync in [SqliteSynchronous::Normal, SqliteSynchronous::Full] {
        for batch in [1, BATCH] {
            let path = dir.path().join(format!("ceiling-{sync:?}-{batch}.db"));
            // The store creates the schema; the loop then writes on a connection of its own.
            SqliteStore::connect(path.to_str().ok_or("utf-8 path")?)
                .await?
                .pool()
                .close()
                .await;
            let options =
                SqliteStore::connect_options(path.to_str().ok_or("utf-8 path")?)?.synchronous(sync);
            let mut conn = SqliteConnection::connect_with(&options).await?;
            let started = Instant::now();
            run(&mut conn, keys, batch).await?;
            let rate = keys as f64 / started.elapsed().as_secs_f64();
            println!(
                "  synchronous = {sync:?}, {:>2} per transaction: {rate:>9.0} /s",
                batch
            );
            conn.close().await?;
        }
    }
    Ok(())
}

/// Every key: read (finds nothing), insert the claim, complete it. With `batch` > 1 the
/// claims of `batch` keys commit together, then their completions together — as the
/// group-commit writer batches concurrent requests' claims, then their completions.
async fn run(conn: &mut SqliteConnection, keys: usize, batch: usize) -> Result<(), sqlx::Error> {
    let headers = vec![0u8; 48];
    let body = vec![b'x'; 80];
    let fingerprint = [7u8; 32];
    for first in (0..keys).step_by(batch) {
        let chunk: Vec<String> = (first..keys.min(first + batch))
            .map(|n| format!("k{n}"))
            .collect();
        for key in &chunk {
            sqlx::query(READ)
                .bind("acct")
                .bind(key)
                .fetch_optional(&mut *conn)
                .await?;
        }
        for statement in [INSERT, COMPLETE] {
            let write = |key: &str| {
                let query = sqlx::query(statement).bind("acct").bind(key.to_owned());
                if statement == INSERT {
                    query.bind(&fingerprint[..]).bind(1_i64)
                } else {
                    query.bind(1_i64).bind(&headers).bind(&body)
                }
            };
            if batch > 1 {
                let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
                for key in &chunk {
                    write(key).execute(&mut *tx).await?;
                }
                tx.commit().await?;
            } else {
                for key in &chunk {
                    write(key).execute(&mut *conn).await?;
                }
            }
        }
    }
    Ok(())
}
