//! [`Scope`]: whose key space an idempotency key lives in.

use std::borrow::Cow;

/// The authenticated caller an idempotency key belongs to. Keys are unique per scope,
/// so two callers may both send `order-1042`.
///
/// Implement it for the type your authentication extractor yields. The scope must come
/// from authentication, never from a header the client controls.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the idempotency scope: it does not implement `Scope`",
    label = "`scope` names an argument of this type",
    note = "implement `idempotent_runtime::Scope` for the authenticated caller's type (e.g. return its account id), or point `scope` at the argument that identifies the caller"
)]
pub trait Scope {
    /// A stable identifier of the caller, e.g. an account id.
    fn scope(&self) -> Cow<'_, str>;
}

impl Scope for String {
    fn scope(&self) -> Cow<'_, str> {
        Cow::Borrowed(self)
    }
}

impl Scope for str {
    fn scope(&self) -> Cow<'_, str> {
        Cow::Borrowed(self)
    }
}

impl<T: Scope + ?Sized> Scope for &T {
    fn scope(&self) -> Cow<'_, str> {
        (**self).scope()
    }
}

macro_rules! scope_for_integers {
    ($($ty:ty),*) => {$(
        impl Scope for $ty {
            fn scope(&self) -> Cow<'_, str> {
                Cow::Owned(self.to_string())
            }
        }
    )*};
}
scope_for_integers!(
    u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize
);
