//! Which layer, over which store, one server process serves.

use std::fmt;

/// Where the idempotent engine keeps its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    Memory,
    SqliteNormal,
    SqliteFull,
    Postgres,
    MySql,
    Redis,
}

/// One benchmark variant: the same handler behind one idempotency layer (or none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// The handler alone.
    Bare,
    /// `#[idempotent]` over one of our stores.
    Idempotent(StoreKind),
    /// axum-idempotent 0.6 over ruts' in-memory (moka) session store.
    AxumIdempotent,
    /// The least work a correct in-process layer does, by hand (`floor_app.rs`).
    Floor,
    /// The floor's reading and fingerprinting alone: no claim, nothing kept.
    FingerprintOnly,
}

impl Variant {
    /// Every variant this server serves, by its command-line name.
    pub const ALL: [Variant; 10] = [
        Variant::Bare,
        Variant::Idempotent(StoreKind::Memory),
        Variant::Idempotent(StoreKind::SqliteNormal),
        Variant::Idempotent(StoreKind::SqliteFull),
        Variant::Idempotent(StoreKind::Postgres),
        Variant::Idempotent(StoreKind::MySql),
        Variant::Idempotent(StoreKind::Redis),
        Variant::AxumIdempotent,
        Variant::Floor,
        Variant::FingerprintOnly,
    ];

    /// The command-line name, as the driver and the results table spell it.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Bare => "bare",
            Variant::Idempotent(StoreKind::Memory) => "idempotent-memory",
            Variant::Idempotent(StoreKind::SqliteNormal) => "idempotent-sqlite-normal",
            Variant::Idempotent(StoreKind::SqliteFull) => "idempotent-sqlite-full",
            Variant::Idempotent(StoreKind::Postgres) => "idempotent-postgres",
            Variant::Idempotent(StoreKind::MySql) => "idempotent-mysql",
            Variant::Idempotent(StoreKind::Redis) => "idempotent-redis",
            Variant::AxumIdempotent => "axum-idempotent",
            Variant::Floor => "floor-memory",
            Variant::FingerprintOnly => "fingerprint-only",
        }
    }

    /// The variant named `name`, if this server serves it.
    pub fn parse(name: &str) -> Option<Variant> {
        Self::ALL.into_iter().find(|variant| variant.name() == name)
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
