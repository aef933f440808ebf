//! placeholder until the macro work lands
use proc_macro::TokenStream;
/// placeholder
#[proc_macro_attribute]
pub fn idempotent(_args: TokenStream, item: TokenStream) -> TokenStream { item }
