//! The problem answers the library makes itself (`400` key, `409`, `422`, `503`, …),
//! marked as such, and rendered in the application's own error envelope when it gave one
//! ([`IdempotencyBuilder::render_problems`](crate::IdempotencyBuilder::render_problems)).
//!
//! Every such answer is built problem+json and carries its [`Problem`] in a response
//! extension; the HTTP doors hand each response to [`ProblemRenderer::render`] on its way
//! out, which replaces the body of a marked one and keeps the engine's status and headers.

use std::fmt;
use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use http::header;

use crate::problem::Problem;

/// Marks a response the library made from this problem (a response extension).
#[derive(Debug, Clone)]
struct LibraryProblem(Problem);

impl Problem {
    /// The library's own answer: this problem as problem+json, marked so that an
    /// application's renderer can give it its own body.
    pub(crate) fn into_answer(self) -> Response {
        let marker = LibraryProblem(self.clone());
        let mut response = self.into_response();
        response.extensions_mut().insert(marker);
        response
    }
}

/// Marks `response`, a problem+json answer the library built itself, as made from
/// `problem`.
pub(crate) fn mark(mut response: Response, problem: Problem) -> Response {
    response.extensions_mut().insert(LibraryProblem(problem));
    response
}

/// How an application renders the library's problems; problem+json when none is given.
type Render = dyn Fn(Problem) -> Response + Send + Sync;

/// The application's renderer of the library's own problem answers, if it gave one.
#[derive(Clone, Default)]
pub(crate) struct ProblemRenderer(Option<Arc<Render>>);

impl fmt::Debug for ProblemRenderer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.0.is_some() {
            "application"
        } else {
            "problem+json"
        };
        f.debug_tuple("ProblemRenderer").field(&kind).finish()
    }
}

impl ProblemRenderer {
    /// A renderer calling `render`.
    pub(crate) fn new(render: impl Fn(Problem) -> Response + Send + Sync + 'static) -> Self {
        Self(Some(Arc::new(render)))
    }

    /// Whether the application gave a renderer.
    pub(crate) fn is_set(&self) -> bool {
        self.0.is_some()
    }

    /// `response` as the client gets it: a library problem rendered by the application's
    /// renderer, with the library's status and every header the library set except the
    /// body's type and length (`Retry-After`, `Idempotent-Replayed`, `Location`, …);
    /// anything else as it is. The mark is removed, so a response passes through at most
    /// one renderer.
    pub(crate) fn render(&self, mut response: Response) -> Response {
        let Some(LibraryProblem(problem)) = response.extensions_mut().remove() else {
            return response;
        };
        let Some(render) = &self.0 else {
            return response;
        };
        let (library, _) = response.into_parts();
        let mut rendered = render(problem);
        *rendered.status_mut() = library.status;
        let headers = rendered.headers_mut();
        let kept = |name: &header::HeaderName| {
            *name != header::CONTENT_TYPE && *name != header::CONTENT_LENGTH
        };
        for name in library.headers.keys().filter(|name| kept(name)) {
            headers.remove(name);
        }
        for (name, value) in library.headers.iter().filter(|(name, _)| kept(name)) {
            headers.append(name.clone(), value.clone());
        }
        rendered
    }
}
