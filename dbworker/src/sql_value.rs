//! `SqlValue`: a value bound to a statement, in dbworker's own type, so
//! sea-query (which builds every statement) stays out of the public API and
//! its version out of ours.

/// A value bound to a statement, never formatted into its text: a column's
/// value in [`NewJob::set`](crate::NewJob::set), a parameter of
/// [`DbConditions::and_sql`](crate::DbConditions::and_sql). Made from
/// booleans, integers, floats, text, JSON, arrays of them, and `Option`s of
/// them (`None` is a typed `NULL`).
///
/// ```
/// use dbworker::SqlValue;
/// let values: Vec<SqlValue> = vec![42_i64.into(), "text".into(), None::<i32>.into()];
/// assert_eq!(values.len(), 3);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct SqlValue(pub(crate) sea_query::Value);

macro_rules! from_values {
    ($($t:ty),* $(,)?) => {
        $(
            impl From<$t> for SqlValue {
                fn from(value: $t) -> SqlValue {
                    SqlValue(value.into())
                }
            }

            impl From<Option<$t>> for SqlValue {
                fn from(value: Option<$t>) -> SqlValue {
                    SqlValue(value.into())
                }
            }
        )*
    };
}

from_values!(
    bool,
    i16,
    i32,
    i64,
    f32,
    f64,
    String,
    serde_json::Value,
    Vec<i32>,
    Vec<i64>,
    Vec<String>,
);

impl From<&str> for SqlValue {
    fn from(value: &str) -> SqlValue {
        SqlValue(value.into())
    }
}

impl From<&String> for SqlValue {
    fn from(value: &String) -> SqlValue {
        SqlValue(value.as_str().into())
    }
}

impl From<&[i64]> for SqlValue {
    fn from(value: &[i64]) -> SqlValue {
        SqlValue(value.to_vec().into())
    }
}

impl From<&[String]> for SqlValue {
    fn from(value: &[String]) -> SqlValue {
        SqlValue(value.to_vec().into())
    }
}
