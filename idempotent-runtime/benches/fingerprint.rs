//! Fingerprint throughput: raw mode and canonical-JSON mode, on ~1 KiB and ~64 KiB bodies.
//!
//! Run with `cargo bench -p idempotent-runtime --all-features --bench fingerprint`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use http::Method;
use idempotent_runtime::{Fingerprint, FingerprintMode};

/// Deterministic pseudo-random bytes (xorshift), so runs are comparable.
fn bytes(len: usize) -> Vec<u8> {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// A payment-like JSON document of at least `min_len` bytes: an array of objects with
/// unsorted keys, nested objects, escapes, numbers of several spellings and whitespace.
fn json_document(min_len: usize) -> Vec<u8> {
    let mut doc = String::from("{\n  \"payments\": [\n");
    let mut i = 0u32;
    while doc.len() < min_len {
        if i > 0 {
            doc.push_str(",\n");
        }
        doc.push_str(&format!(
            "    {{ \"id\": \"pay_{i:08}\", \"currency\": \"EUR\", \"amount\": {amount}, \
             \"fee\": {fee}.5e-2, \"captured\": {captured},\n      \
             \"metadata\": {{ \"order\": \"ord\\u00e9-{i}\", \"note\": \"line\\nbreak \\\"q\\\"\", \
             \"tags\": [\"a\", \"b\", {i}] }}, \"customer\": null }}",
            amount = 1000 + i * 7,
            fee = i % 100,
            captured = i.is_multiple_of(2),
        ));
        i += 1;
    }
    doc.push_str("\n  ],\n  \"count\": ");
    doc.push_str(&i.to_string());
    doc.push_str("\n}\n");
    doc.into_bytes()
}

fn fingerprint(c: &mut Criterion) {
    let mut group = c.benchmark_group("fingerprint");
    let inputs = [
        ("raw", FingerprintMode::Raw, "1KiB", bytes(1024)),
        ("raw", FingerprintMode::Raw, "64KiB", bytes(64 * 1024)),
        ("json", FingerprintMode::Json, "1KiB", json_document(1024)),
        (
            "json",
            FingerprintMode::Json,
            "64KiB",
            json_document(64 * 1024),
        ),
    ];
    for (name, mode, size, body) in &inputs {
        if *mode == FingerprintMode::Json {
            assert!(
                serde_json::from_slice::<serde_json::Value>(body).is_ok(),
                "the benchmark document must be valid JSON"
            );
            // ...and take the canonical path, not the invalid-JSON fallback: extra
            // whitespace between tokens (every raw newline is between tokens) is ignored.
            let spaced = String::from_utf8_lossy(body).replace('\n', "\n \t");
            let fp = |b: &[u8]| Fingerprint::compute(*mode, &Method::POST, "/p", None, b);
            assert_eq!(fp(body), fp(spaced.as_bytes()), "not canonicalised");
        }
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_with_input(BenchmarkId::new(*name, size), body, |b, body| {
            b.iter(|| {
                Fingerprint::compute(
                    black_box(*mode),
                    black_box(&Method::POST),
                    black_box("/payments"),
                    black_box(Some("expand=customer")),
                    black_box(body),
                )
            })
        });
    }
    group.finish();
}

criterion_group!(benches, fingerprint);
criterion_main!(benches);
