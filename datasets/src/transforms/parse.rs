//! The spec grammar: a comma-separated list of torchvision-style calls, or a JSON list of
//! objects. Both become a list of [`Call`]s, which `super` binds to transforms.

use super::TransformError;

/// One argument value as written.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Value {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    None,
    Seq(Vec<Value>),
}

impl Value {
    /// Describes the value's type for error messages.
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Self::Int(_) => "an integer",
            Self::Float(_) => "a number",
            Self::Bool(_) => "a boolean",
            Self::Str(_) => "a string",
            Self::None => "None",
            Self::Seq(_) => "a sequence",
        }
    }
}

/// One transform as written: its name, positional and keyword arguments.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Call {
    pub name: String,
    pub positional: Vec<Value>,
    pub keyword: Vec<(String, Value)>,
}

/// Deepest nesting of sequences accepted, so that no input can exhaust the stack.
const MAX_DEPTH: usize = 8;

/// Parses a spec: JSON if it starts with `[`, else the call syntax.
pub(super) fn parse(spec: &str) -> Result<Vec<Call>, TransformError> {
    if spec.trim_start().starts_with('[') {
        parse_json(spec)
    } else {
        Parser {
            src: spec,
            pos: 0,
            depth: 0,
        }
        .spec()
    }
}

fn parse_json(spec: &str) -> Result<Vec<Call>, TransformError> {
    let value: serde_json::Value =
        serde_json::from_str(spec).map_err(|e| TransformError::Json(e.to_string()))?;
    let serde_json::Value::Array(items) = value else {
        return Err(TransformError::Json("expected a list of objects".into()));
    };
    let mut calls = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let serde_json::Value::Object(map) = item else {
            return Err(TransformError::Json(format!(
                "item {i} is not an object like {{\"name\": \"RandomCrop\", \"size\": 32}}"
            )));
        };
        let mut name = None;
        let mut keyword = Vec::new();
        for (key, value) in map {
            if key == "name" {
                match value {
                    serde_json::Value::String(s) => name = Some(s),
                    _ => {
                        return Err(TransformError::Json(format!(
                            "item {i}: \"name\" must be a string"
                        )));
                    }
                }
            } else {
                keyword.push((key, from_json(value, 0)?));
            }
        }
        let name = name.ok_or_else(|| TransformError::Json(format!("item {i} has no \"name\"")))?;
        calls.push(Call {
            name,
            positional: Vec::new(),
            keyword,
        });
    }
    Ok(calls)
}

fn from_json(value: serde_json::Value, depth: usize) -> Result<Value, TransformError> {
    Ok(match value {
        serde_json::Value::Null => Value::None,
        serde_json::Value::Bool(b) => Value::Bool(b),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => Value::Int(i),
            None => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        serde_json::Value::String(s) => Value::Str(s),
        serde_json::Value::Array(items) if depth < MAX_DEPTH => Value::Seq(
            items
                .into_iter()
                .map(|v| from_json(v, depth + 1))
                .collect::<Result<_, _>>()?,
        ),
        serde_json::Value::Array(_) => {
            return Err(TransformError::Json("sequences nested too deeply".into()));
        }
        serde_json::Value::Object(_) => {
            return Err(TransformError::Json(
                "an argument cannot be an object".into(),
            ));
        }
    })
}

struct Parser<'a> {
    src: &'a str,
    pos: usize,
    depth: usize,
}

impl<'a> Parser<'a> {
    fn err(&self, message: impl Into<String>) -> TransformError {
        TransformError::Syntax {
            at: self.pos,
            message: message.into(),
        }
    }

    fn peek(&self) -> Option<char> {
        self.src[self.pos..].chars().next()
    }

    fn skip_ws(&mut self) {
        while let Some(c) = self.peek() {
            if !c.is_whitespace() {
                break;
            }
            self.pos += c.len_utf8();
        }
    }

    fn eat(&mut self, c: char) -> bool {
        self.skip_ws();
        if self.peek() == Some(c) {
            self.pos += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn ident(&mut self) -> Option<&'a str> {
        self.skip_ws();
        let start = self.pos;
        while let Some(c) = self.peek() {
            if c.is_ascii_alphanumeric() || c == '_' || (c == '.' && self.pos > start) {
                self.pos += 1;
            } else {
                break;
            }
        }
        let src: &'a str = self.src;
        let s = &src[start..self.pos];
        match s.chars().next() {
            Some(c) if c.is_ascii_alphabetic() || c == '_' => Some(s),
            _ => {
                self.pos = start;
                None
            }
        }
    }

    fn spec(mut self) -> Result<Vec<Call>, TransformError> {
        let mut calls = Vec::new();
        loop {
            self.skip_ws();
            if self.peek().is_none() {
                break;
            }
            calls.push(self.call()?);
            if !self.eat(',') {
                self.skip_ws();
                if self.peek().is_some() {
                    return Err(self.err("expected ',' or the end after a transform"));
                }
                break;
            }
        }
        Ok(calls)
    }

    fn call(&mut self) -> Result<Call, TransformError> {
        let name = self
            .ident()
            .ok_or_else(|| self.err("expected a transform name like RandomCrop"))?;
        // `T.RandomCrop` and `transforms.RandomCrop` name the same transform.
        let name = name.rsplit('.').next().unwrap_or(name).to_owned();
        if !self.eat('(') {
            return Err(self.err(format!("expected '(' after {name}")));
        }
        let mut call = Call {
            name,
            positional: Vec::new(),
            keyword: Vec::new(),
        };
        loop {
            if self.eat(')') {
                return Ok(call);
            }
            let save = self.pos;
            if let Some(key) = self.ident().map(str::to_owned) {
                if self.eat('=') {
                    let value = self.value()?;
                    call.keyword.push((key, value));
                } else {
                    self.pos = save;
                    let value = self.value()?;
                    self.positional(&mut call, value)?;
                }
            } else {
                let value = self.value()?;
                self.positional(&mut call, value)?;
            }
            if !self.eat(',') {
                if self.eat(')') {
                    return Ok(call);
                }
                return Err(self.err(format!("expected ',' or ')' in {}(...)", call.name)));
            }
        }
    }

    fn positional(&self, call: &mut Call, value: Value) -> Result<(), TransformError> {
        if !call.keyword.is_empty() {
            return Err(self.err(format!(
                "{}: positional argument after a keyword argument",
                call.name
            )));
        }
        call.positional.push(value);
        Ok(())
    }

    fn value(&mut self) -> Result<Value, TransformError> {
        self.skip_ws();
        match self.peek() {
            Some(open @ ('(' | '[')) => {
                if self.depth >= MAX_DEPTH {
                    return Err(self.err("sequences nested too deeply"));
                }
                self.pos += 1;
                self.depth += 1;
                let close = if open == '(' { ')' } else { ']' };
                let mut items = Vec::new();
                loop {
                    if self.eat(close) {
                        break;
                    }
                    items.push(self.value()?);
                    if !self.eat(',') {
                        if self.eat(close) {
                            break;
                        }
                        return Err(self.err(format!("expected ',' or '{close}' in a sequence")));
                    }
                }
                self.depth -= 1;
                Ok(Value::Seq(items))
            }
            Some(q @ ('\'' | '"')) => {
                self.pos += 1;
                let rest = &self.src[self.pos..];
                let end = rest
                    .find(q)
                    .ok_or_else(|| self.err("unterminated string"))?;
                let s = rest[..end].to_owned();
                self.pos += end + 1;
                Ok(Value::Str(s))
            }
            Some(c) if c.is_ascii_digit() || c == '-' || c == '+' || c == '.' => {
                let first = self.number()?;
                if self.eat('/') {
                    let den = self.number()?;
                    let (a, b) = (as_f64(&first), as_f64(&den));
                    if b == 0.0 {
                        return Err(self.err("division by zero"));
                    }
                    Ok(Value::Float(a / b))
                } else {
                    Ok(first)
                }
            }
            _ => match self.ident() {
                Some("True" | "true") => Ok(Value::Bool(true)),
                Some("False" | "false") => Ok(Value::Bool(false)),
                Some("None" | "null") => Ok(Value::None),
                Some(other) => {
                    let other = other.to_owned();
                    Err(self.err(format!(
                        "unexpected name {other:?} where a value was expected (quote strings)"
                    )))
                }
                None => Err(self.err("expected a value")),
            },
        }
    }

    fn number(&mut self) -> Result<Value, TransformError> {
        self.skip_ws();
        let start = self.pos;
        let bytes = self.src.as_bytes();
        let mut i = self.pos;
        if i < bytes.len() && (bytes[i] == b'-' || bytes[i] == b'+') {
            i += 1;
        }
        let mut float = false;
        while i < bytes.len() {
            match bytes[i] {
                b'0'..=b'9' => i += 1,
                b'.' => {
                    float = true;
                    i += 1;
                }
                b'e' | b'E' => {
                    float = true;
                    i += 1;
                    if i < bytes.len() && (bytes[i] == b'-' || bytes[i] == b'+') {
                        i += 1;
                    }
                }
                _ => break,
            }
        }
        let text = &self.src[start..i];
        self.pos = i;
        let parsed = if float {
            text.parse::<f64>().ok().map(Value::Float)
        } else {
            text.parse::<i64>().ok().map(Value::Int)
        };
        parsed.ok_or_else(|| TransformError::Syntax {
            at: start,
            message: format!("{text:?} is not a number"),
        })
    }
}

/// A number's value as a float (non-numbers are NaN, which every range check rejects).
pub(super) fn as_f64(v: &Value) -> f64 {
    match *v {
        Value::Int(i) => i as f64,
        Value::Float(f) => f,
        _ => f64::NAN,
    }
}
