//! The demo applications and the plumbing they share. The apps show what a user of
//! `idempotent` writes (handlers, state and engine wiring, router); the binaries
//! (`src/bin/`), the examples (`examples/`) and the end-to-end tests all run this code, so
//! the tests drive the very handlers a reader sees.
//!
//! - [`payments`]: the payments API over a fake gateway and a fake mailer, in three steps
//!   (recovery points);
//! - [`consumer`]: the payments demo's charge consumer (NATS JetStream, RabbitMQ): one
//!   gateway charge per command under a derived key, one ledger row through the inbox;
//! - [`ledger`]: a transactional handler (SQLite, with twins for Postgres and MySQL);
//! - `chaos` (feature `postgres`): the chaos check of the payments demo;
//! - [`fault_proxy`]: a TCP proxy that drops requests and cuts answers, for the chaos
//!   check and the client half's tests;
//! - [`auth`]: bearer-token authentication with fixed demo API keys (the idempotency
//!   scope);
//! - [`cli`]: the flags, each with an environment fallback;
//! - [`database`]: SQLite or Postgres, chosen by URL, shared by the store and the demo;
//! - [`gateway`]: a fake payment provider that deduplicates on the key it is sent, and the
//!   effects log the fake providers append to;
//! - [`mailer`]: a fake mailer that sends (and counts) receipts;
//! - [`prometheus`]: `GET /metrics`, the engine's metrics in the Prometheus text format;
//! - [`serve`]: logging, the serve loop and a graceful shutdown that drains the engine.

pub mod amount;
pub mod auth;
#[cfg(feature = "postgres")]
pub mod chaos;
pub mod cli;
pub mod consumer;
pub mod database;
pub mod fault_proxy;
pub mod gateway;
pub mod ledger;
pub mod mailer;
pub mod payments;
pub mod prometheus;
pub mod serve;

/// The README's Rust block, compiled as a doc test (`cargo test --doc -p idempotent-demo`)
/// so its example cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The links of the repository's front pages, checked: a reader of a fresh clone (or of
/// the repository on GitHub) must be able to follow every one of them.
#[cfg(test)]
mod doc_links {
    use std::path::{Path, PathBuf};

    /// The pages checked, relative to the repository root.
    const PAGES: [&str; 2] = ["README.md", "CONTRIBUTING.md"];

    /// The crates whose docs.rs pages do not exist until they are published; links to
    /// them would be dead. Empty this list when they are.
    const UNPUBLISHED: [&str; 2] = ["idempotent-runtime", "idempotent-macros"];

    /// Every link target of a Markdown page: inline links `[text](target)` and reference
    /// definitions `[label]: target`, outside fenced code blocks.
    fn links(markdown: &str) -> Vec<String> {
        let mut found = Vec::new();
        let mut fenced = false;
        for line in markdown.lines() {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                continue;
            }
            if fenced {
                continue;
            }
            if let Some(rest) = line.strip_prefix('[')
                && let Some((_, target)) = rest.split_once("]: ")
            {
                found.push(target.trim().to_owned());
                continue;
            }
            let mut rest = line;
            while let Some(start) = rest.find("](") {
                let after = &rest[start + 2..];
                let Some(end) = after.find(')') else { break };
                found.push(after[..end].trim().to_owned());
                rest = &after[end..];
            }
        }
        found
    }

    /// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as dashes.
    fn anchor(heading: &str) -> String {
        heading
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect()
    }

    /// The anchors of a Markdown page's headings.
    fn anchors(markdown: &str) -> Vec<String> {
        markdown
            .lines()
            .filter_map(|line| line.strip_prefix('#'))
            .map(|heading| anchor(heading.trim_start_matches('#')))
            .collect()
    }

    /// Why `target`, linked from the page at `page`, does not resolve; `None` if it does.
    fn broken(page: &Path, target: &str) -> Option<String> {
        if let Some(url) = target
            .strip_prefix("https://")
            .or_else(|| target.strip_prefix("http://"))
        {
            let unpublished = UNPUBLISHED
                .iter()
                .find(|name| url.starts_with(&format!("docs.rs/{name}")));
            return unpublished.map(|name| {
                format!("{name} is not on docs.rs yet: link the guide's file in the repository")
            });
        }
        if target.contains("://") || target.starts_with("mailto:") {
            return None;
        }
        let (path, fragment) = match target.split_once('#') {
            Some((path, fragment)) => (path, Some(fragment)),
            None => (target, None),
        };
        let file: PathBuf = if path.is_empty() {
            page.to_owned()
        } else {
            page.parent().unwrap().join(path)
        };
        if !file.exists() {
            return Some(format!("{} does not exist", file.display()));
        }
        let fragment = fragment?;
        let text = std::fs::read_to_string(&file).ok()?;
        (!anchors(&text).iter().any(|a| a == fragment))
            .then(|| format!("{} has no heading #{fragment}", file.display()))
    }

    #[test]
    fn every_link_of_the_front_pages_resolves() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut problems = Vec::new();
        for page in PAGES {
            let path = root.join(page);
            let text = std::fs::read_to_string(&path).unwrap();
            let targets = links(&text);
            assert!(
                !targets.is_empty(),
                "{page}: no links found; is the parser broken?"
            );
            for target in targets {
                if let Some(why) = broken(&path, &target) {
                    problems.push(format!("{page}: {target}: {why}"));
                }
            }
        }
        assert!(problems.is_empty(), "{problems:#?}");
    }

    /// The crates are not on crates.io yet: the dependency line a reader copies must be a
    /// git dependency on the repository the workspace names, or `cargo build` fails.
    #[test]
    fn the_dependency_lines_to_copy_name_the_repository() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
        let repository = manifest
            .lines()
            .find_map(|line| line.strip_prefix("repository = "))
            .expect("the workspace names its repository")
            .trim();
        for page in ["README.md", "idempotent-runtime/src/guide/01_app.md"] {
            let text = std::fs::read_to_string(root.join(page)).unwrap();
            let lines: Vec<&str> = text
                .lines()
                .filter(|line| line.starts_with("idempotent-runtime = "))
                .collect();
            assert!(!lines.is_empty(), "{page}: no dependency line");
            for line in lines {
                assert!(
                    line.contains(&format!("git = {repository}")),
                    "{page}: `{line}` does not resolve before publication; use \
                     {{ git = {repository} }}"
                );
            }
        }
    }

    #[test]
    fn the_checker_finds_what_breaks() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let page = root.join("README.md");
        let markdown = "[a](missing.md) and [b](CONTRIBUTING.md#checks)\n\
                        ```\n[not](a-link.md)\n```\n\
                        [c]: https://docs.rs/idempotent-runtime/latest/x\n";
        assert_eq!(
            links(markdown),
            [
                "missing.md",
                "CONTRIBUTING.md#checks",
                "https://docs.rs/idempotent-runtime/latest/x"
            ]
        );
        assert!(broken(&page, "missing.md").is_some());
        assert!(broken(&page, "CONTRIBUTING.md#checks").is_none());
        assert!(broken(&page, "CONTRIBUTING.md#no-such-heading").is_some());
        assert!(broken(&page, "https://docs.rs/idempotent-runtime/latest/x").is_some());
        assert!(broken(&page, "https://docs.rs/axum").is_none());
        assert_eq!(anchor(" Retention (TTL)"), "retention-ttl");
        assert_eq!(anchor(" What `idempotent` does"), "what-idempotent-does");
    }
}
