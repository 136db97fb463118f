//! `DbConditions`: the extra claim conditions a `pre_dequeue` hook returns.

use sea_query::Expr;

use crate::sql_value::SqlValue;

/// Extra dequeue conditions returned by `pre_dequeue`: SQL conditions ANDed
/// into the claim's `WHERE`, over the view's (or table's) alias.
///
/// ```
/// use dbworker::DbConditions;
/// // Values are bound, never formatted into the SQL.
/// let conditions = DbConditions::new().and_sql("j.cost <= $1", [40_i64]);
/// assert_eq!(conditions.len(), 1);
/// ```
#[derive(Debug, Clone, Default)]
pub struct DbConditions(pub(super) Vec<Expr>);

impl DbConditions {
    /// No extra condition.
    pub fn new() -> Self {
        DbConditions(Vec::new())
    }

    /// Adds a condition written in SQL over the claim's alias, its `$1`,
    /// `$2`, … bound to `values` in order (never formatted into the text).
    pub fn and_sql<V: Into<SqlValue>>(
        self,
        sql: impl Into<String>,
        values: impl IntoIterator<Item = V>,
    ) -> Self {
        let values: Vec<sea_query::Value> = values.into_iter().map(|v| v.into().0).collect();
        self.and(Expr::cust_with_values(sql.into(), values))
    }

    fn and(mut self, condition: Expr) -> Self {
        self.0.push(condition);
        self
    }

    /// Adds `column = ANY(values)`, with `column` written as `alias.column` over
    /// the view's (or table's) alias (each part is quoted; the values are bound).
    /// For a [`KindRegistry`](workerutil::KindRegistry) that claims only its kinds:
    ///
    /// ```
    /// use dbworker::DbConditions;
    /// let only = DbConditions::new().column_in("j.kind", &["email".to_owned()]);
    /// assert_eq!(only.len(), 1);
    /// ```
    ///
    /// A value holding a NUL character is left out: no `text` value can equal
    /// it, and bound, it would make every claim fail.
    pub fn column_in(self, column: &str, values: &[String]) -> Self {
        // `j."order"` is taken unquoted first; other text is split on dots.
        let parts = crate::columns::parse_dotted(column)
            .unwrap_or_else(|| column.split('.').map(str::to_owned).collect());
        let column: Vec<String> = parts.iter().map(|p| crate::sql::quote(p)).collect();
        let values: Vec<String> = values
            .iter()
            .filter(|v| !v.contains('\0'))
            .cloned()
            .collect();
        self.and(Expr::cust_with_values(
            format!("{} = ANY($1)", column.join(".")),
            [sea_query::Value::from(values)],
        ))
    }

    /// How many conditions there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
