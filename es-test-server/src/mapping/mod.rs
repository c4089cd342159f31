//! Mappings: the field types and the data model of a mapping (objects, fields, resolved field
//! facts). Parsing, merging and rendering are in `definition`; turning a `_source` into the
//! indexed values of each field, and dynamic mapping, in `document`.

mod definition;
mod document;
mod stored;

pub(crate) use self::document::{DocCtx, FV, IndexOutcome, Indexed, TextField};

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::{Map, Value};

use crate::analysis::{Analysis, Analyzer, Filter};
use crate::error::{EsError, EsResult};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Dynamic {
    True,
    False,
    Strict,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum FType {
    Keyword,
    Text,
    Long,
    Integer,
    Short,
    Byte,
    Double,
    Float,
    HalfFloat,
    Date,
    DateNanos,
    Boolean,
    Binary,
}

impl FType {
    fn parse(s: &str) -> Option<FType> {
        Some(match s {
            "keyword" => FType::Keyword,
            "text" => FType::Text,
            "long" => FType::Long,
            "integer" => FType::Integer,
            "short" => FType::Short,
            "byte" => FType::Byte,
            "double" => FType::Double,
            "float" => FType::Float,
            "half_float" => FType::HalfFloat,
            "date" => FType::Date,
            "date_nanos" => FType::DateNanos,
            "boolean" => FType::Boolean,
            "binary" => FType::Binary,
            _ => return None,
        })
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            FType::Keyword => "keyword",
            FType::Text => "text",
            FType::Long => "long",
            FType::Integer => "integer",
            FType::Short => "short",
            FType::Byte => "byte",
            FType::Double => "double",
            FType::Float => "float",
            FType::HalfFloat => "half_float",
            FType::Date => "date",
            FType::DateNanos => "date_nanos",
            FType::Boolean => "boolean",
            FType::Binary => "binary",
        }
    }

    pub(crate) fn is_integer(self) -> bool {
        matches!(
            self,
            FType::Long | FType::Integer | FType::Short | FType::Byte
        )
    }

    pub(crate) fn is_float(self) -> bool {
        matches!(self, FType::Double | FType::Float | FType::HalfFloat)
    }

    fn allowed_params(self) -> &'static [&'static str] {
        const COMMON: &[&str] = &["index", "doc_values", "store", "meta", "fields", "copy_to"];
        let own: &[&str] = match self {
            FType::Keyword => &[
                "ignore_above",
                "null_value",
                "normalizer",
                "eager_global_ordinals",
                "index_options",
                "norms",
                "similarity",
                "split_queries_on_whitespace",
                "script",
                "on_script_error",
                "time_series_dimension",
            ],
            FType::Text => &[
                "analyzer",
                "search_analyzer",
                "search_quote_analyzer",
                "fielddata",
                "fielddata_frequency_filter",
                "index_options",
                "index_prefixes",
                "index_phrases",
                "norms",
                "position_increment_gap",
                "similarity",
                "term_vector",
                "eager_global_ordinals",
            ],
            FType::Date | FType::DateNanos => &[
                "format",
                "locale",
                "ignore_malformed",
                "null_value",
                "script",
                "on_script_error",
                "precision_step",
            ],
            FType::Boolean => &[
                "null_value",
                "ignore_malformed",
                "script",
                "on_script_error",
            ],
            FType::Binary => &[],
            _ => &[
                "coerce",
                "ignore_malformed",
                "null_value",
                "script",
                "on_script_error",
                "time_series_metric",
                "time_series_dimension",
            ],
        };
        if self == FType::Binary {
            return &["doc_values", "store", "meta"];
        }
        // Caller checks both lists.
        let _ = COMMON;
        own
    }
}

/// A leaf field (or a multi-field) with everything resolved that indexing and search need.
#[derive(Debug, Clone)]
pub(crate) struct FieldDef {
    pub ty: FType,
    pub params: Map<String, Value>,
    pub subfields: BTreeMap<String, FieldDef>,
    pub id: u16,
}

#[derive(Debug, Clone)]
pub(crate) struct ObjectDef {
    pub dynamic: Option<Dynamic>,
    pub enabled: bool,
    pub props: BTreeMap<String, Node>,
    pub params: Map<String, Value>,
}

#[derive(Debug, Clone)]
pub(crate) enum Node {
    Object(ObjectDef),
    Field(FieldDef),
}

/// Resolved facts about one indexed field, looked up by full dotted name.
#[derive(Debug, Clone)]
pub(crate) struct FieldInfo {
    pub name: String,
    pub ty: FType,
    pub id: u16,
    pub ignore_above: Option<usize>,
    pub analyzer: Analyzer,
    pub search_analyzer: Analyzer,
    pub normalizer: Option<Vec<Filter>>,
    pub index: bool,
    pub doc_values: bool,
    pub null_value: Option<Value>,
    pub format: String,
    /// `store: true`: returned by `stored_fields`.
    pub store: bool,
    pub coerce: bool,
    pub ignore_malformed: bool,
    pub fielddata: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct Mapping {
    pub root: ObjectDef,
    pub root_extra: Map<String, Value>,
    pub date_detection: bool,
    pub numeric_detection: bool,
    pub next_id: u16,
    pub fields: Vec<FieldInfo>,
    pub by_name: HashMap<String, u16>,
    pub objects: HashSet<String>,
    pub analysis: Analysis,
}

fn mapper_err(reason: impl Into<String>) -> EsError {
    EsError::new(400, "mapper_parsing_exception", reason)
}

fn parse_dynamic(v: &Value) -> EsResult<Dynamic> {
    match v {
        Value::Bool(true) => Ok(Dynamic::True),
        Value::Bool(false) => Ok(Dynamic::False),
        Value::String(s) => match s.as_str() {
            "true" => Ok(Dynamic::True),
            "false" => Ok(Dynamic::False),
            "strict" => Ok(Dynamic::Strict),
            "runtime" => Err(EsError::unsupported("dynamic: runtime")),
            _ => Err(mapper_err(format!(
                "Could not convert [dynamic] to boolean, value [{s}]"
            ))),
        },
        other => Err(mapper_err(format!(
            "Could not convert [dynamic] to boolean, value [{other}]"
        ))),
    }
}

fn value_str(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn as_bool_param(v: &Value, name: &str, field: &str) -> EsResult<bool> {
    match v {
        Value::Bool(b) => Ok(*b),
        Value::String(s) if s == "true" => Ok(true),
        Value::String(s) if s == "false" => Ok(false),
        other => Err(mapper_err(format!(
            "Failed to parse mapping: Cannot parse value [{}] for parameter [{name}] of field [{field}]",
            value_str(other)
        ))),
    }
}
