//! Amounts in minor units, as both demos read them from a JSON body: a positive integer
//! (`10000`), as JSON numbers go. JSON does not tell `500` from `500.0` or `5e2`, and
//! neither does the JSON Schema `integer` the demos publish, so neither does the handler.

/// The largest amount: `i64::MAX`, the column's type (`BIGINT`).
pub const MAX: i64 = i64::MAX;

/// `value` as a positive whole number of minor units, at most [`MAX`]; `None` for
/// anything else (a fraction, zero, a negative, a string, `null`, too large).
///
/// ```
/// use idempotent_demo::amount::minor_units;
/// use serde_json::json;
///
/// assert_eq!(minor_units(&json!(10000)), Some(10000));
/// assert_eq!(minor_units(&json!(500.0)), Some(500));
/// assert_eq!(minor_units(&json!(i64::MAX)), Some(i64::MAX));
/// assert_eq!(minor_units(&json!(0)), None);
/// assert_eq!(minor_units(&json!(1.5)), None);
/// assert_eq!(minor_units(&json!(u64::MAX)), None);
/// assert_eq!(minor_units(&json!("10000")), None);
/// ```
pub fn minor_units(value: &serde_json::Value) -> Option<i64> {
    if let Some(amount) = value.as_i64() {
        return (amount >= 1).then_some(amount);
    }
    // A number written with a fraction or an exponent arrives as a float; whole ones
    // below 2^63 (the first float past `MAX`) are exact in an i64.
    let float = value.as_f64()?;
    let whole = float.fract() == 0.0 && (1.0..MAX as f64).contains(&float);
    whole.then_some(float as i64)
}
