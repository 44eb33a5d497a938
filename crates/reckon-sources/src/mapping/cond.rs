//! The small language of a mapping's state conditions: column names, comparisons with
//! literals, `IS [NOT] NULL`, `[NOT] IN (...)`, `AND`, `OR`, `NOT` and parentheses. It is
//! parsed into a typed tree here and rendered by `render.rs` with quoted identifiers and
//! bound parameters, so nothing a tenant writes in a mapping reaches SQL as text: a
//! condition cannot call a function, read another table or write.
//!
//! ```text
//! expr    := and ( OR and )*
//! and     := unary ( AND unary )*
//! unary   := NOT unary | '(' expr ')' | test
//! test    := column IS [NOT] NULL
//!          | column [NOT] IN '(' literal ( ',' literal )* ')'
//!          | column op literal            op := = | <> | != | < | <= | > | >=
//! literal := 'text' ('' for a quote) | number | TRUE | FALSE
//! column  := [A-Za-z_][A-Za-z0-9_]{0,62}
//! ```

use std::fmt;

/// A literal of a condition, bound as a parameter of its own type.
#[derive(Debug, Clone, PartialEq)]
pub enum Lit {
    Text(String),
    Int(i64),
    Real(f64),
    Bool(bool),
    /// A key as bytes (reckon's own lookups by key; the grammar never makes one).
    Bytes(Vec<u8>),
}

impl fmt::Display for Lit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Lit::Text(s) => write!(f, "'{}'", s.replace('\'', "''")),
            Lit::Int(i) => write!(f, "{i}"),
            Lit::Real(r) => write!(f, "{r}"),
            Lit::Bool(b) => f.write_str(if *b { "TRUE" } else { "FALSE" }),
            Lit::Bytes(b) => write!(f, "{} bytes", b.len()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Op {
    pub fn sql(self) -> &'static str {
        match self {
            Op::Eq => "=",
            Op::Ne => "<>",
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Gt => ">",
            Op::Ge => ">=",
        }
    }
}

/// A condition over one row's columns.
#[derive(Debug, Clone, PartialEq)]
pub enum Cond {
    Cmp(String, Op, Lit),
    IsNull(String, bool),
    In(String, bool, Vec<Lit>),
    And(Box<Cond>, Box<Cond>),
    Or(Box<Cond>, Box<Cond>),
    Not(Box<Cond>),
}

impl Cond {
    /// Every column the condition names, each once, in the order written.
    pub fn columns(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        self.walk(&mut |c| {
            if !out.contains(&c) {
                out.push(c);
            }
        });
        out
    }

    fn walk<'a>(&'a self, f: &mut impl FnMut(&'a str)) {
        match self {
            Cond::Cmp(c, _, _) | Cond::IsNull(c, _) | Cond::In(c, _, _) => f(c),
            Cond::And(a, b) | Cond::Or(a, b) => {
                a.walk(f);
                b.walk(f);
            }
            Cond::Not(a) => a.walk(f),
        }
    }
}

/// Why a condition does not parse: a sentence naming where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(pub String);

/// Conditions are short; a longer text is not a condition someone wrote by hand.
const MAX_LEN: usize = 2000;
/// Nesting beyond this is refused, so a hostile condition cannot exhaust the stack.
const MAX_DEPTH: usize = 32;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    Num(String),
    Sym(&'static str),
}

fn describe(t: Option<&Tok>) -> String {
    match t {
        None => "the end".into(),
        Some(Tok::Ident(s)) => format!("{s:?}"),
        Some(Tok::Str(s)) => format!("the text '{s}'"),
        Some(Tok::Num(s)) => format!("the number {s}"),
        Some(Tok::Sym(s)) => format!("{s:?}"),
    }
}

#[expect(
    clippy::string_slice,
    reason = "every index is a boundary: the scan advances over ASCII bytes one at a time, \
              or to just past a quote `find` located"
)]
fn lex(src: &str) -> Result<Vec<Tok>, ParseError> {
    if src.len() > MAX_LEN {
        return Err(ParseError(format!(
            "it is longer than {MAX_LEN} characters"
        )));
    }
    let b = src.as_bytes();
    let mut i = 0;
    let mut out = Vec::new();
    while i < b.len() {
        let c = b[i];
        match c {
            b' ' | b'\t' | b'\n' | b'\r' => i += 1,
            b'(' | b')' | b',' | b'=' => {
                out.push(Tok::Sym(match c {
                    b'(' => "(",
                    b')' => ")",
                    b',' => ",",
                    _ => "=",
                }));
                i += 1;
            }
            b'<' | b'>' | b'!' => {
                let two = b.get(i + 1).copied();
                let sym = match (c, two) {
                    (b'<', Some(b'=')) => "<=",
                    (b'<', Some(b'>')) => "<>",
                    (b'>', Some(b'=')) => ">=",
                    (b'!', Some(b'=')) => "!=",
                    (b'<', _) => "<",
                    (b'>', _) => ">",
                    _ => return Err(ParseError("'!' is only allowed in '!='".into())),
                };
                i += sym.len();
                out.push(Tok::Sym(sym));
            }
            b'\'' => {
                let mut s = String::new();
                i += 1;
                loop {
                    let Some(rest) = src.get(i..) else {
                        return Err(ParseError("a text literal is not closed".into()));
                    };
                    let Some(q) = rest.find('\'') else {
                        return Err(ParseError("a text literal is not closed".into()));
                    };
                    s.push_str(&rest[..q]);
                    i += q + 1;
                    if b.get(i) == Some(&b'\'') {
                        s.push('\'');
                        i += 1;
                    } else {
                        break;
                    }
                }
                if s.contains('\0') {
                    return Err(ParseError("a text literal contains a NUL character".into()));
                }
                out.push(Tok::Str(s));
            }
            b'0'..=b'9' | b'-' | b'.' => {
                let start = i;
                i += 1;
                while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'.') {
                    i += 1;
                }
                out.push(Tok::Num(src[start..i].to_owned()));
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
                out.push(Tok::Ident(src[start..i].to_owned()));
            }
            b'"' | b'`' | b'[' => {
                return Err(ParseError(
                    "column names are written bare (letters, digits, '_'): reckon quotes them"
                        .into(),
                ));
            }
            b';' => return Err(ParseError("';' is not part of a condition".into())),
            _ => {
                let ch = src[i..].chars().next().unwrap_or('?');
                return Err(ParseError(format!("{ch:?} is not part of a condition")));
            }
        }
    }
    Ok(out)
}

const KEYWORDS: [&str; 8] = ["and", "or", "not", "is", "null", "in", "true", "false"];

fn keyword(t: Option<&Tok>, k: &str) -> bool {
    matches!(t, Some(Tok::Ident(s)) if s.eq_ignore_ascii_case(k))
}

struct Parser {
    toks: Vec<Tok>,
    at: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.at)
    }

    fn next(&mut self) -> Option<Tok> {
        let t = self.toks.get(self.at).cloned();
        self.at += 1;
        t
    }

    fn expect(&mut self, sym: &'static str) -> Result<(), ParseError> {
        match self.next() {
            Some(Tok::Sym(s)) if s == sym => Ok(()),
            other => Err(ParseError(format!(
                "expected {sym:?} but found {}",
                describe(other.as_ref())
            ))),
        }
    }

    fn expr(&mut self) -> Result<Cond, ParseError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(ParseError(format!(
                "it nests deeper than {MAX_DEPTH} levels"
            )));
        }
        let mut left = self.and()?;
        while keyword(self.peek(), "or") {
            self.at += 1;
            let right = self.and()?;
            left = Cond::Or(Box::new(left), Box::new(right));
        }
        self.depth -= 1;
        Ok(left)
    }

    fn and(&mut self) -> Result<Cond, ParseError> {
        let mut left = self.unary()?;
        while keyword(self.peek(), "and") {
            self.at += 1;
            let right = self.unary()?;
            left = Cond::And(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Cond, ParseError> {
        if keyword(self.peek(), "not") {
            self.at += 1;
            self.depth += 1;
            if self.depth > MAX_DEPTH {
                return Err(ParseError(format!(
                    "it nests deeper than {MAX_DEPTH} levels"
                )));
            }
            let inner = self.unary()?;
            self.depth -= 1;
            return Ok(Cond::Not(Box::new(inner)));
        }
        if self.peek() == Some(&Tok::Sym("(")) {
            self.at += 1;
            let inner = self.expr()?;
            self.expect(")")?;
            return Ok(inner);
        }
        self.test()
    }

    fn test(&mut self) -> Result<Cond, ParseError> {
        let column = match self.next() {
            Some(Tok::Ident(s)) if !KEYWORDS.iter().any(|k| s.eq_ignore_ascii_case(k)) => {
                column_name(&s)?;
                s
            }
            other => {
                return Err(ParseError(format!(
                    "expected a column name but found {}",
                    describe(other.as_ref())
                )));
            }
        };
        if keyword(self.peek(), "is") {
            self.at += 1;
            let negated = keyword(self.peek(), "not");
            if negated {
                self.at += 1;
            }
            if !keyword(self.peek(), "null") {
                return Err(ParseError(format!(
                    "after {column} IS{} only NULL is allowed, found {}",
                    if negated { " NOT" } else { "" },
                    describe(self.peek())
                )));
            }
            self.at += 1;
            return Ok(Cond::IsNull(column, !negated));
        }
        let negated = keyword(self.peek(), "not");
        if negated {
            self.at += 1;
        }
        if keyword(self.peek(), "in") {
            self.at += 1;
            self.expect("(")?;
            let mut items = vec![self.literal(&column)?];
            while self.peek() == Some(&Tok::Sym(",")) {
                self.at += 1;
                items.push(self.literal(&column)?);
            }
            self.expect(")")?;
            return Ok(Cond::In(column, negated, items));
        }
        if negated {
            return Err(ParseError(format!(
                "after {column} NOT only IN is allowed, found {}",
                describe(self.peek())
            )));
        }
        let op = match self.next() {
            Some(Tok::Sym("=")) => Op::Eq,
            Some(Tok::Sym("<>" | "!=")) => Op::Ne,
            Some(Tok::Sym("<")) => Op::Lt,
            Some(Tok::Sym("<=")) => Op::Le,
            Some(Tok::Sym(">")) => Op::Gt,
            Some(Tok::Sym(">=")) => Op::Ge,
            other => {
                return Err(ParseError(format!(
                    "after the column {column} expected a comparison (=, <>, <, <=, >, >=), \
                     IS [NOT] NULL or [NOT] IN, found {}",
                    describe(other.as_ref())
                )));
            }
        };
        Ok(Cond::Cmp(column.clone(), op, self.literal(&column)?))
    }

    fn literal(&mut self, column: &str) -> Result<Lit, ParseError> {
        match self.next() {
            Some(Tok::Str(s)) => Ok(Lit::Text(s)),
            Some(Tok::Num(n)) => {
                if let Ok(i) = n.parse::<i64>() {
                    Ok(Lit::Int(i))
                } else {
                    match n.parse::<f64>() {
                        Ok(f) if f.is_finite() => Ok(Lit::Real(f)),
                        _ => Err(ParseError(format!("{n} is not a number"))),
                    }
                }
            }
            Some(Tok::Ident(s)) if s.eq_ignore_ascii_case("true") => Ok(Lit::Bool(true)),
            Some(Tok::Ident(s)) if s.eq_ignore_ascii_case("false") => Ok(Lit::Bool(false)),
            Some(Tok::Ident(s)) => Err(ParseError(format!(
                "the column {column} is compared with {s:?}, which is not a literal (only \
                 'text', numbers, TRUE and FALSE; a column is never compared with a column)"
            ))),
            other => Err(ParseError(format!(
                "expected a literal ('text', a number, TRUE or FALSE) after the column \
                 {column}, found {}",
                describe(other.as_ref())
            ))),
        }
    }
}

/// A column name as a mapping may write it: an identifier reckon quotes itself.
pub fn column_name(name: &str) -> Result<(), ParseError> {
    let b = name.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_');
    if ok {
        Ok(())
    } else {
        Err(ParseError(format!(
            "{name:?} is not a column name (letters, digits and '_', up to 63, not starting \
             with a digit)"
        )))
    }
}

/// Parse a condition.
pub fn parse(src: &str) -> Result<Cond, ParseError> {
    let toks = lex(src)?;
    if toks.is_empty() {
        return Err(ParseError("it is empty".into()));
    }
    let mut p = Parser {
        toks,
        at: 0,
        depth: 0,
    };
    let c = p.expr()?;
    if p.at < p.toks.len() {
        return Err(ParseError(format!(
            "unexpected {} after a complete condition",
            describe(p.peek())
        )));
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(c: &str) -> String {
        c.to_owned()
    }

    #[test]
    fn conditions_parse_into_a_typed_tree_with_and_binding_tighter_than_or() {
        let c =
            parse("recovery_point = 'finished' AND response_code >= 500 OR response_code IS NULL")
                .unwrap();
        assert_eq!(
            c,
            Cond::Or(
                Box::new(Cond::And(
                    Box::new(Cond::Cmp(
                        col("recovery_point"),
                        Op::Eq,
                        Lit::Text("finished".into())
                    )),
                    Box::new(Cond::Cmp(col("response_code"), Op::Ge, Lit::Int(500))),
                )),
                Box::new(Cond::IsNull(col("response_code"), true)),
            )
        );
        let c = parse("NOT (state in ('a', 'it''s') or x <> -1.5) and y is not null and b = true")
            .unwrap();
        assert_eq!(c.columns(), vec!["state", "x", "y", "b"]);
        assert!(matches!(
            parse("x NOT IN (1, 2)").unwrap(),
            Cond::In(_, true, ref v) if v == &[Lit::Int(1), Lit::Int(2)]
        ));
        assert_eq!(
            parse("s = 'it''s'").unwrap(),
            Cond::Cmp(col("s"), Op::Eq, Lit::Text("it's".into()))
        );
    }

    #[test]
    fn anything_but_the_grammar_is_refused_with_where_it_went_wrong() {
        for (bad, says) in [
            ("", "empty"),
            ("state = 'x'; DROP TABLE t", "';'"),
            ("lower(state) = 'x'", "expected a comparison"),
            ("state = other_column", "not a literal"),
            ("\"state\" = 'x'", "bare"),
            ("state = 'x", "not closed"),
            (
                "state = 'x' AND",
                "expected a column name but found the end",
            ),
            ("state == 'x'", "expected a literal"),
            ("state IS 'x'", "only NULL"),
            ("state NOT = 'x'", "only IN"),
            ("(state = 'x'", "expected \")\""),
            ("state = 'x' extra", "after a complete condition"),
            ("x = 1.2.3", "not a number"),
            ("x = 1 -- comment", "after a complete condition"),
            ("x = 1 /* c */", "'/'"),
            ("and = 1", "expected a column name"),
        ] {
            let e = parse(bad).unwrap_err().0;
            assert!(e.contains(says), "{bad:?} gave {e:?}");
        }
        let deep = format!("{}x = 1{}", "(".repeat(40), ")".repeat(40));
        assert!(parse(&deep).unwrap_err().0.contains("deeper"));
        let nots = format!("{}x = 1", "NOT ".repeat(40));
        assert!(parse(&nots).unwrap_err().0.contains("deeper"));
        assert!(parse(&"x = 1 OR ".repeat(300)).is_err());
    }
}
