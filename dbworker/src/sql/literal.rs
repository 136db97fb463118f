//! A statement with its values written into its text, for the one-message
//! simple protocol behind a transaction pooler (see `pooler.rs`).
//!
//! Each `$n` becomes a literal cast to the very type sqlx would have bound
//! (`(E'…'::text)`, `('42'::int8)`, `('{1,2}'::int8[])`), so the server
//! resolves the statement exactly as it resolves the prepared one. Strings
//! are `E''` literals with `\` and `'` doubled, which mean the same under
//! either `standard_conforming_strings`. A value this file cannot write
//! exactly (a NUL, which would end the simple-protocol message; a type it
//! does not know) makes the statement go the prepared way instead.

use std::fmt::Write;

use sea_query::{ArrayType, Value};

use super::Statement;

/// The statement's text with every placeholder replaced by its value, or
/// `None` when a value cannot be written as a literal, or when the text holds
/// a `;` outside quotes: the extended protocol refuses a second statement,
/// the simple one would run it.
pub(super) fn inline(statement: &Statement) -> Option<String> {
    let values = &statement.values.0.0;
    let sql: &str = &statement.sql;
    let mut out = String::with_capacity(sql.len() + 16 * values.len());
    let mut rest = sql;
    loop {
        match next_placeholder(rest) {
            Found::Placeholder(before, index, after) => {
                out.push_str(before);
                out.push('(');
                literal(&mut out, values.get(index.checked_sub(1)?)?)?;
                out.push(')');
                rest = after;
            }
            Found::Unwritable => return None,
            Found::End => break,
        }
    }
    out.push_str(rest);
    Some(out)
}

/// What [`next_placeholder`] met first outside quotes, comments and
/// dollar-quoted text.
#[derive(Debug, PartialEq)]
enum Found<'a> {
    /// `$n`: the text before it, `n`, and the text after it.
    Placeholder(&'a str, usize, &'a str),
    /// A `;` (a second statement), or a placeholder no statement has.
    Unwritable,
    End,
}

/// The first `$n` or `;` outside quotes, comments and dollar-quoted text.
fn next_placeholder(sql: &str) -> Found<'_> {
    let bytes = sql.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\'' => i = skip_string(bytes, i),
            b'"' => i = skip_until(bytes, i + 1, b"\""),
            b'-' if bytes.get(i + 1) == Some(&b'-') => i = skip_until(bytes, i + 2, b"\n"),
            b'/' if bytes.get(i + 1) == Some(&b'*') => i = skip_until(bytes, i + 2, b"*/"),
            b';' => return Found::Unwritable,
            b'$' => {
                let digits = bytes[i + 1..]
                    .iter()
                    .take_while(|b| b.is_ascii_digit())
                    .count();
                let word_before =
                    i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
                if digits > 0 && !word_before {
                    let end = i + 1 + digits;
                    return match sql[i + 1..end].parse() {
                        Ok(n) => Found::Placeholder(&sql[..i], n, &sql[end..]),
                        Err(_) => Found::Unwritable,
                    };
                }
                i = match dollar_tag(bytes, i) {
                    Some(tag) => skip_until(bytes, i + tag.len(), tag),
                    None => i + 1,
                };
            }
            _ => i += 1,
        }
    }
    Found::End
}

/// Past the string literal opening at `i`: `''` stays inside it, and so
/// does `\'` when it is an `E''` literal.
fn skip_string(bytes: &[u8], i: usize) -> usize {
    let escapes = i > 0 && matches!(bytes[i - 1], b'E' | b'e');
    let mut j = i + 1;
    while j < bytes.len() {
        match bytes[j] {
            b'\\' if escapes => j += 2,
            b'\'' if bytes.get(j + 1) == Some(&b'\'') => j += 2,
            b'\'' => return j + 1,
            _ => j += 1,
        }
    }
    j
}

/// Past the first `end` at or after `from` (or to the end of the text).
fn skip_until(bytes: &[u8], from: usize, end: &[u8]) -> usize {
    bytes[from.min(bytes.len())..]
        .windows(end.len())
        .position(|w| w == end)
        .map_or(bytes.len(), |at| from + at + end.len())
}

/// The `$tag$` opening dollar-quoted text at `i`, if one does.
fn dollar_tag(bytes: &[u8], i: usize) -> Option<&[u8]> {
    let len = bytes[i + 1..]
        .iter()
        .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_')
        .count();
    (bytes.get(i + 1 + len) == Some(&b'$')).then(|| &bytes[i..i + len + 2])
}

/// Writes `value` as a literal of the type sqlx binds it as.
fn literal(out: &mut String, value: &Value) -> Option<()> {
    if let Value::Array(ty, values) = value {
        return array(out, ty, values.as_deref().map(Vec::as_slice));
    }
    let (text, ty) = scalar(value)?;
    match text {
        Some(text) => quoted(out, &text)?,
        None => out.push_str("NULL"),
    }
    let _ = write!(out, "::{ty}");
    Some(())
}

/// A scalar value's input text (`None` for NULL) and the type sqlx binds
/// it as; `None` for a kind of value this file does not write.
fn scalar(value: &Value) -> Option<(Option<String>, &'static str)> {
    let int = |n: Option<i64>| n.map(|n| n.to_string());
    Some(match value {
        Value::Bool(v) => (v.map(|b| if b { "t" } else { "f" }.to_owned()), "bool"),
        Value::SmallInt(v) => (int(v.map(i64::from)), "int2"),
        Value::Int(v) => (int(v.map(i64::from)), "int4"),
        Value::BigInt(v) => (int(*v), "int8"),
        Value::TinyUnsigned(v) => (int(v.map(i64::from)), "int2"),
        Value::SmallUnsigned(v) => (int(v.map(i64::from)), "int4"),
        Value::Unsigned(v) => (int(v.map(i64::from)), "int8"),
        Value::BigUnsigned(v) => match v {
            Some(n) => (Some(i64::try_from(*n).ok()?.to_string()), "int8"),
            None => (None, "int8"),
        },
        Value::Float(v) => (v.map(|f| float(f64::from(f))), "float4"),
        Value::Double(v) => (v.map(float), "float8"),
        Value::String(v) => (v.clone(), "text"),
        Value::Char(v) => (v.map(String::from), "text"),
        Value::Bytes(v) => (v.as_deref().map(bytea), "bytea"),
        Value::Json(v) => (v.as_ref().map(|j| j.to_string()), "jsonb"),
        _ => return None,
    })
}

/// An array of one of the scalar types above, as one array literal.
fn array(out: &mut String, ty: &ArrayType, values: Option<&[Value]>) -> Option<()> {
    let ty = match ty {
        ArrayType::Bool => "bool",
        ArrayType::SmallInt | ArrayType::TinyUnsigned => "int2",
        ArrayType::Int | ArrayType::SmallUnsigned => "int4",
        ArrayType::BigInt | ArrayType::Unsigned | ArrayType::BigUnsigned => "int8",
        ArrayType::Float => "float4",
        ArrayType::Double => "float8",
        ArrayType::String | ArrayType::Char => "text",
        ArrayType::Bytes => "bytea",
        ArrayType::Json => "jsonb",
        _ => return None,
    };
    let Some(values) = values else {
        let _ = write!(out, "NULL::{ty}[]");
        return Some(());
    };
    // The array's own syntax inside the one string literal: every element
    // double-quoted, with `"` and the backslash escaped by a backslash.
    let mut text = String::from("{");
    for (i, value) in values.iter().enumerate() {
        if i > 0 {
            text.push(',');
        }
        match scalar(value)?.0 {
            Some(element) => {
                text.push('"');
                for c in element.chars() {
                    if matches!(c, '"' | '\\') {
                        text.push('\\');
                    }
                    text.push(c);
                }
                text.push('"');
            }
            None => text.push_str("NULL"),
        }
    }
    text.push('}');
    quoted(out, &text)?;
    let _ = write!(out, "::{ty}[]");
    Some(())
}

/// `E'…'` with `\` and `'` doubled; `None` for a NUL, which the
/// simple-protocol message cannot carry (and no text column can hold).
fn quoted(out: &mut String, text: &str) -> Option<()> {
    if text.contains('\0') {
        return None;
    }
    out.push_str("E'");
    for c in text.chars() {
        if matches!(c, '\\' | '\'') {
            out.push(c);
        }
        out.push(c);
    }
    out.push('\'');
    Some(())
}

/// A float as PostgreSQL reads it back to the same value.
fn float(f: f64) -> String {
    if f.is_nan() {
        "NaN".into()
    } else if f.is_infinite() {
        if f > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else {
        // Rust writes the shortest text that reads back to the same value.
        format!("{f:?}")
    }
}

/// `bytea`'s hex input form.
fn bytea(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(2 + 2 * bytes.len());
    text.push_str("\\x");
    for b in bytes {
        let _ = write!(text, "{b:02x}");
    }
    text
}

#[cfg(test)]
mod tests {
    use sea_query::{ArrayType, Value};
    use sea_query_sqlx::SqlxValues;
    use sqlx::Row;

    use super::{Found, inline, next_placeholder};
    use crate::sql::Statement;

    fn statement(sql: &str, values: Vec<Value>) -> Statement {
        Statement {
            sql: sql.into(),
            values: SqlxValues(sea_query::Values(values)),
        }
    }

    #[test]
    fn placeholders_inside_quotes_comments_and_dollar_quotes_are_text() {
        let sql = r#"SELECT '$1', E'\'$1', 'it''s $1', "$1", $x$ $1 $x$, $$ $1 $$ -- $1
            /* $1 */ a$1, $12"#;
        let Found::Placeholder(before, n, after) = next_placeholder(sql) else {
            panic!("the real one is missed");
        };
        assert_eq!(n, 12);
        assert!(before.ends_with(", ") && after.is_empty(), "{before:?}");
        assert_eq!(next_placeholder("SELECT 1"), Found::End);
        assert_eq!(next_placeholder("SELECT ';' -- ;"), Found::End);
        assert_eq!(next_placeholder("SELECT 1; SELECT $1"), Found::Unwritable);
    }

    #[test]
    fn each_value_is_written_as_a_literal_of_its_bound_type() {
        let s = statement(
            "UPDATE t SET a = $2 WHERE id = ANY($1) AND b = $3 AND c IS $4",
            vec![
                Value::Array(
                    ArrayType::BigInt,
                    Some(Box::new(vec![1_i64.into(), 2_i64.into()])),
                ),
                Value::String(Some(r"it's a \ path".into())),
                Value::Json(Some(Box::new(serde_json::json!({"k": "v'"})))),
                Value::Bool(None),
            ],
        );
        assert_eq!(
            inline(&s).unwrap(),
            r#"UPDATE t SET a = (E'it''s a \\ path'::text) WHERE id = ANY((E'{"1","2"}'::int8[])) AND b = (E'{"k":"v''"}'::jsonb) AND c IS (NULL::bool)"#
        );
    }

    #[test]
    fn a_nul_an_unknown_placeholder_or_a_second_statement_leaves_it_prepared() {
        let nul = statement("SELECT $1", vec![Value::String(Some("a\0b".into()))]);
        assert_eq!(inline(&nul), None);
        let missing = statement("SELECT $2", vec![Value::Int(Some(1))]);
        assert_eq!(inline(&missing), None);
        let zero = statement("SELECT $0", vec![Value::Int(Some(1))]);
        assert_eq!(inline(&zero), None);
        let two = statement("SELECT $1; SELECT 2", vec![Value::Int(Some(1))]);
        assert_eq!(inline(&two), None);
    }

    /// On the server: each value inlined reads back as the same value of the
    /// same type as when bound.
    #[tokio::test]
    async fn an_inlined_value_is_the_bound_value_on_the_server() {
        let db = dbworker_testkit::TestDatabase::new()
            .await
            .expect("a database");
        let pool = sqlx::PgPool::connect(db.url()).await.expect("a pool");
        let texts = [
            "plain",
            "it's",
            r"back\slash \' \\' E'x'",
            "\"quoted\" {braces} , comma",
            "tab\tnew\nline\r\u{1a}",
            "ünï€ødé 🚀",
            "$1 $$ $x$ -- /*",
            "",
        ];
        let mut values: Vec<Value> = texts
            .iter()
            .map(|t| Value::String(Some((*t).into())))
            .collect();
        values.extend([
            Value::String(None),
            Value::Bool(Some(true)),
            Value::Bool(Some(false)),
            Value::SmallInt(Some(-32_768)),
            Value::Int(Some(i32::MIN)),
            Value::BigInt(Some(i64::MIN)),
            Value::BigInt(Some(i64::MAX)),
            Value::Unsigned(Some(u32::MAX)),
            Value::BigUnsigned(Some(42)),
            Value::Double(Some(0.1)),
            Value::Double(Some(-1.5e-300)),
            Value::Double(Some(f64::NAN)),
            Value::Double(Some(f64::NEG_INFINITY)),
            Value::Float(Some(0.1)),
            Value::Char(Some('\'')),
            Value::Bytes(Some(vec![0, 1, 0x5c, 0x27, 0xff])),
            Value::Json(Some(Box::new(serde_json::json!({
                "s": "it's \\ \"q\" \u{1}", "n": 1.5, "a": [null, true], "u": "\u{2028}"
            })))),
            Value::Array(ArrayType::BigInt, Some(Box::new(vec![]))),
            Value::Array(
                ArrayType::String,
                Some(Box::new(
                    texts
                        .iter()
                        .map(|t| Value::String(Some((*t).into())))
                        .collect(),
                )),
            ),
            Value::Array(ArrayType::Int, None),
        ]);
        for value in values {
            let sql = "SELECT ($1)::text AS v, pg_typeof($1)::text AS t, ($1) IS NULL AS n";
            // Unnamed: sqlx's cache would keep the first value's types.
            let bound = statement(sql, vec![value.clone()])
                .query()
                .persistent(false)
                .fetch_one(&pool)
                .await
                .expect("the bound statement");
            let text = inline(&statement(sql, vec![value.clone()])).expect("inlined");
            let inlined = sqlx::raw_sql(sqlx::AssertSqlSafe(text.clone()))
                .fetch_one(&pool)
                .await
                .unwrap_or_else(|e| panic!("{text}: {e}"));
            for column in ["v", "t"] {
                let a: Option<String> = bound.get(column);
                let b: Option<String> = inlined.get(column);
                assert_eq!(a, b, "{column} of {value:?} as {text}");
            }
            assert_eq!(bound.get::<bool, _>("n"), inlined.get::<bool, _>("n"));
        }
    }
}
