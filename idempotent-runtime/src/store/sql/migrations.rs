//! Embedded migrations: the migrator every SQL store runs on open, and the check that
//! what is embedded is exactly what `migrations/<dialect>/` holds.

use std::borrow::Cow;

use sqlx::SqlSafeStr;
use sqlx::migrate::{Migration, MigrationType, Migrator};

/// One migration compiled into the binary (`include_str!` of its file).
#[derive(Debug, Clone, Copy)]
pub(crate) struct EmbeddedMigration {
    /// The number before the first `_` of the file name, as `sqlx migrate` names them.
    pub(crate) version: i64,
    /// The rest of the file name, `_` read as spaces.
    pub(crate) description: &'static str,
    /// The file's contents.
    pub(crate) sql: &'static str,
}

/// A migrator over `migrations` that records applied versions in `table` — never sqlx's
/// default `_sqlx_migrations`: an app sharing the database may run its own migrations,
/// and a migrator refuses a table holding versions it does not know.
pub(crate) fn migrator(
    migrations: &'static [EmbeddedMigration],
    table: impl Into<Cow<'static, str>>,
) -> Migrator {
    let migrations = migrations
        .iter()
        .map(|m| {
            Migration::new(
                m.version,
                Cow::Borrowed(m.description),
                MigrationType::Simple,
                m.sql.into_sql_str(),
                false,
            )
        })
        .collect();
    let mut migrator = Migrator::with_migrations(migrations);
    migrator.dangerous_set_table_name(table);
    migrator
}

/// Panics unless `embedded` holds exactly the files of `migrations/<dialect>/`, in
/// version order, with their versions, descriptions and contents.
#[cfg(test)]
pub(crate) fn assert_embedded_migrations_match(dialect: &str, embedded: &[EmbeddedMigration]) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("migrations")
        .join(dialect);
    let mut on_disk: Vec<(i64, String, String)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.expect("directory entry").path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let stem = name.strip_suffix(".sql").expect("a .sql file");
            let (version, description) = stem.split_once('_').expect("<version>_<description>");
            (
                version.parse().expect("a numeric version"),
                description.replace('_', " "),
                std::fs::read_to_string(&path).expect("migration file"),
            )
        })
        .collect();
    on_disk.sort();
    let embedded: Vec<(i64, String, String)> = embedded
        .iter()
        .map(|m| (m.version, m.description.to_owned(), m.sql.to_owned()))
        .collect();
    assert_eq!(
        embedded,
        on_disk,
        "embedded migrations differ from {}",
        dir.display()
    );
}
