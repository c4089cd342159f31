//! Mappings: parsing, dynamic mapping, merging (PUT _mapping), rendering (GET _mapping) and
//! turning a `_source` into the indexed values of each field.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::{Map, Value, json};

use crate::analysis::{Analysis, Analyzer, Filter, apply_filters};
use crate::error::{EsError, EsResult};
use crate::time;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Dynamic {
    True,
    False,
    Strict,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FType {
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

    pub fn name(self) -> &'static str {
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

    pub fn is_integer(self) -> bool {
        matches!(
            self,
            FType::Long | FType::Integer | FType::Short | FType::Byte
        )
    }

    pub fn is_float(self) -> bool {
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
pub struct FieldDef {
    pub ty: FType,
    pub params: Map<String, Value>,
    pub subfields: BTreeMap<String, FieldDef>,
    pub id: u16,
}

#[derive(Debug, Clone)]
pub struct ObjectDef {
    pub dynamic: Option<Dynamic>,
    pub enabled: bool,
    pub props: BTreeMap<String, Node>,
    pub params: Map<String, Value>,
}

#[derive(Debug, Clone)]
pub enum Node {
    Object(ObjectDef),
    Field(FieldDef),
}

/// Resolved facts about one indexed field, looked up by full dotted name.
#[derive(Debug, Clone)]
pub struct FieldInfo {
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
    pub coerce: bool,
    pub ignore_malformed: bool,
    pub fielddata: bool,
}

#[derive(Debug, Clone)]
pub struct Mapping {
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

impl Mapping {
    pub fn empty(analysis: Analysis) -> Mapping {
        Mapping {
            root: ObjectDef {
                dynamic: None,
                enabled: true,
                props: BTreeMap::new(),
                params: Map::new(),
            },
            root_extra: Map::new(),
            date_detection: true,
            numeric_detection: false,
            next_id: 0,
            fields: vec![],
            by_name: HashMap::new(),
            objects: HashSet::new(),
            analysis,
        }
    }

    pub fn root_dynamic(&self) -> Dynamic {
        self.root.dynamic.unwrap_or(Dynamic::True)
    }

    /// Merges a `mappings` body (index creation or PUT _mapping) into this mapping.
    pub fn merge_json(&mut self, body: &Value) -> EsResult<()> {
        let Some(obj) = body.as_object() else {
            return Err(mapper_err(
                "Failed to parse mapping: Expected map for property [mappings]",
            ));
        };
        if obj.len() == 1
            && let Some((k, v)) = obj.iter().next()
            && v.is_object()
            && (k == "_doc"
                || !k.starts_with('_')
                    && k != "properties"
                    && k != "dynamic_templates"
                    && k != "runtime")
            && v.get("properties").is_some()
        {
            return Err(mapper_err(format!(
                "The mapping definition cannot be nested under a type [{k}] unless include_type_name is set to true."
            )));
        }
        let mut unsupported = Vec::new();
        for (k, v) in obj {
            match k.as_str() {
                "properties" => {}
                "dynamic" => self.root.dynamic = Some(parse_dynamic(v)?),
                "date_detection" => self.date_detection = as_bool_param(v, k, "_doc")?,
                "numeric_detection" => self.numeric_detection = as_bool_param(v, k, "_doc")?,
                "_source" => {
                    if v.get("enabled") == Some(&Value::Bool(false))
                        || v.get("mode").and_then(Value::as_str) == Some("disabled")
                    {
                        return Err(EsError::unsupported("disabling _source"));
                    }
                    if v.get("includes").is_some() || v.get("excludes").is_some() {
                        return Err(EsError::unsupported(
                            "_source includes/excludes in mappings",
                        ));
                    }
                    self.root_extra.insert(k.clone(), v.clone());
                }
                "_meta" | "_routing" | "_field_names" | "_data_stream_timestamp" => {
                    self.root_extra.insert(k.clone(), v.clone());
                }
                "dynamic_templates" => {
                    if v.as_array().is_some_and(|a| !a.is_empty()) {
                        return Err(EsError::unsupported("dynamic_templates"));
                    }
                }
                "runtime" => {
                    if v.as_object().is_some_and(|a| !a.is_empty()) {
                        return Err(EsError::unsupported("runtime fields"));
                    }
                }
                _ => unsupported.push(format!("{k} : {}", value_str(v))),
            }
        }
        if !unsupported.is_empty() {
            return Err(mapper_err(format!(
                "Root mapping definition has unsupported parameters:  [{}]",
                unsupported.join("] [")
            )));
        }
        if let Some(props) = obj.get("properties") {
            let props = props.as_object().ok_or_else(|| {
                mapper_err("Failed to parse mapping: Expected map for property [properties]")
            })?;
            let mut root = std::mem::take(&mut self.root.props);
            let r = self.merge_props(&mut root, props, "");
            self.root.props = root;
            r?;
        }
        self.rebuild()
    }

    fn merge_props(
        &mut self,
        into: &mut BTreeMap<String, Node>,
        props: &Map<String, Value>,
        prefix: &str,
    ) -> EsResult<()> {
        for (name, def) in props {
            if name.is_empty() {
                return Err(mapper_err(
                    "Failed to parse mapping: field name cannot be an empty string",
                ));
            }
            // Dotted names are object paths.
            if let Some((head, rest)) = name.split_once('.') {
                let mut inner = Map::new();
                inner.insert(rest.to_string(), def.clone());
                let wrapped = json!({"properties": Value::Object(inner)});
                let mut single = Map::new();
                single.insert(head.to_string(), wrapped);
                self.merge_props(into, &single, prefix)?;
                continue;
            }
            let full = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}.{name}")
            };
            let node = self.parse_node(&full, def)?;
            match (into.get_mut(name), node) {
                (None, node) => {
                    into.insert(name.clone(), node);
                }
                (Some(Node::Object(existing)), Node::Object(new)) => {
                    if let Some(d) = new.dynamic {
                        existing.dynamic = Some(d);
                    }
                    if new.enabled != existing.enabled {
                        return Err(EsError::bad_request(format!(
                            "Mapper for [{full}] conflicts with existing mapper:\n\tCannot update parameter [enabled] from [{}] to [{}]",
                            existing.enabled, new.enabled
                        )));
                    }
                    existing.params.extend(new.params);
                    let props = def
                        .get("properties")
                        .and_then(Value::as_object)
                        .cloned()
                        .unwrap_or_default();
                    let mut sub = std::mem::take(&mut existing.props);
                    let r = self.merge_props(&mut sub, &props, &full);
                    if let Some(Node::Object(existing)) = into.get_mut(name) {
                        existing.props = sub;
                    }
                    r?;
                }
                (Some(Node::Field(existing)), Node::Field(new)) => {
                    if existing.ty != new.ty {
                        return Err(EsError::bad_request(format!(
                            "mapper [{full}] cannot be changed from type [{}] to [{}]",
                            existing.ty.name(),
                            new.ty.name()
                        )));
                    }
                    existing.params = new.params;
                    for (k, v) in new.subfields {
                        existing.subfields.entry(k).or_insert(v);
                    }
                }
                (Some(Node::Object(_)), Node::Field(_))
                | (Some(Node::Field(_)), Node::Object(_)) => {
                    return Err(EsError::bad_request(format!(
                        "can't merge a non object mapping [{full}] with an object mapping"
                    )));
                }
            }
        }
        Ok(())
    }

    fn parse_node(&mut self, full: &str, def: &Value) -> EsResult<Node> {
        let Some(obj) = def.as_object() else {
            return Err(mapper_err(format!(
                "Expected map for property [fields] on field [{full}] but got a class java.lang.String"
            )));
        };
        let ty = obj.get("type").map(value_str);
        match ty.as_deref() {
            None | Some("object") => {
                let mut od = ObjectDef {
                    dynamic: None,
                    enabled: true,
                    props: BTreeMap::new(),
                    params: Map::new(),
                };
                let mut bad = Vec::new();
                for (k, v) in obj {
                    match k.as_str() {
                        "type" | "properties" => {}
                        "dynamic" => {
                            od.dynamic = Some(parse_dynamic(v)?);
                            od.params.insert(k.clone(), json!(value_str(v)));
                        }
                        "enabled" => {
                            od.enabled = as_bool_param(v, k, full)?;
                            od.params.insert(k.clone(), Value::Bool(od.enabled));
                        }
                        "subobjects" => return Err(EsError::unsupported("subobjects")),
                        _ => bad.push(format!("{k} : {}", value_str(v))),
                    }
                }
                if !bad.is_empty() {
                    return Err(mapper_err(format!(
                        "Mapping definition for [{full}] has unsupported parameters:  [{}]",
                        bad.join("] [")
                    )));
                }
                if ty.is_some() && od.enabled && obj.get("properties").is_none() {
                    // {"type":"object"} without properties is fine.
                }
                if let Some(props) = obj.get("properties") {
                    let props = props.as_object().ok_or_else(|| {
                        mapper_err(format!(
                            "Expected map for property [properties] on field [{full}]"
                        ))
                    })?;
                    let mut sub = BTreeMap::new();
                    self.merge_props(&mut sub, props, full)?;
                    od.props = sub;
                }
                Ok(Node::Object(od))
            }
            Some(t) => {
                let Some(ft) = FType::parse(t) else {
                    return Err(match t {
                        "nested"
                        | "flattened"
                        | "ip"
                        | "geo_point"
                        | "geo_shape"
                        | "point"
                        | "shape"
                        | "unsigned_long"
                        | "scaled_float"
                        | "wildcard"
                        | "constant_keyword"
                        | "match_only_text"
                        | "search_as_you_type"
                        | "completion"
                        | "dense_vector"
                        | "sparse_vector"
                        | "rank_feature"
                        | "rank_features"
                        | "alias"
                        | "join"
                        | "percolator"
                        | "version"
                        | "histogram"
                        | "integer_range"
                        | "long_range"
                        | "float_range"
                        | "double_range"
                        | "date_range"
                        | "ip_range"
                        | "token_count"
                        | "murmur3"
                        | "semantic_text"
                        | "aggregate_metric_double"
                        | "counted_keyword"
                        | "annotated_text"
                        | "passthrough" => {
                            EsError::unsupported(&format!("the field type [{t}] (field [{full}])"))
                        }
                        _ => mapper_err(format!(
                            "Failed to parse mapping: No handler for type [{t}] declared on field [{full}]"
                        )),
                    });
                };
                self.parse_field(full, ft, obj, true)
            }
        }
    }

    fn parse_field(
        &mut self,
        full: &str,
        ft: FType,
        obj: &Map<String, Value>,
        allow_fields: bool,
    ) -> EsResult<Node> {
        let mut params = Map::new();
        let mut subfields = BTreeMap::new();
        let mut bad = Vec::new();
        for (k, v) in obj {
            let k = k.as_str();
            if k == "type" {
                continue;
            }
            if k == "fields" {
                if !allow_fields {
                    bad.push(format!("{k} : {}", value_str(v)));
                    continue;
                }
                let f = v.as_object().ok_or_else(|| {
                    mapper_err(format!(
                        "Expected map for property [fields] on field [{full}]"
                    ))
                })?;
                for (sname, sdef) in f {
                    let sfull = format!("{full}.{sname}");
                    let sobj = sdef.as_object().ok_or_else(|| {
                        mapper_err(format!(
                            "Expected map for property [fields] on field [{sfull}]"
                        ))
                    })?;
                    let st = sobj
                        .get("type")
                        .map(value_str)
                        .unwrap_or_else(|| "object".into());
                    let Some(sft) = FType::parse(&st) else {
                        return Err(if st == "object" {
                            mapper_err(format!(
                                "Failed to parse mapping: Type [object] cannot be used in multi field [{sfull}]"
                            ))
                        } else {
                            EsError::unsupported(&format!(
                                "the field type [{st}] (field [{sfull}])"
                            ))
                        });
                    };
                    if let Node::Field(fd) = self.parse_field(&sfull, sft, sobj, false)? {
                        subfields.insert(sname.clone(), fd);
                    }
                }
                continue;
            }
            if k == "copy_to" {
                return Err(EsError::unsupported(&format!("copy_to (field [{full}])")));
            }
            let known = ["index", "doc_values", "store", "meta"].contains(&k)
                || ft.allowed_params().contains(&k);
            if !known {
                bad.push(format!("{k} : {}", value_str(v)));
                continue;
            }
            params.insert(k.to_string(), v.clone());
        }
        if !bad.is_empty() {
            return Err(mapper_err(format!(
                "Failed to parse mapping: unknown parameter [{}] on mapper [{full}] of type [{}]",
                bad[0].split(" : ").next().unwrap_or(""),
                ft.name()
            )));
        }
        // Validate what we resolve.
        let fd = FieldDef {
            ty: ft,
            params,
            subfields,
            id: u16::MAX,
        };
        self.resolve(full, &fd)?;
        Ok(Node::Field(fd))
    }

    /// Computes the FieldInfo of a field definition (validating analyzers and parameters).
    fn resolve(&self, full: &str, fd: &FieldDef) -> EsResult<FieldInfo> {
        let p = &fd.params;
        let get_bool = |k: &str, d: bool| -> EsResult<bool> {
            p.get(k).map(|v| as_bool_param(v, k, full)).unwrap_or(Ok(d))
        };
        let analyzer_named = |k: &str| -> EsResult<Option<Analyzer>> {
            match p.get(k) {
                None => Ok(None),
                Some(v) => {
                    let n = value_str(v);
                    self.analysis
                        .analyzer(&n)
                        .map(Some)
                        .ok_or_else(|| mapper_err(format!("Failed to parse mapping: analyzer [{n}] has not been configured in mappings")))
                }
            }
        };
        let analyzer = analyzer_named("analyzer")?.unwrap_or_else(|| {
            self.analysis
                .analyzers
                .get("default")
                .cloned()
                .unwrap_or_else(Analyzer::standard)
        });
        let search_analyzer =
            analyzer_named("search_analyzer")?.unwrap_or_else(|| analyzer.clone());
        let normalizer = match p.get("normalizer") {
            None => None,
            Some(v) => {
                let n = value_str(v);
                Some(self.analysis.normalizer(&n).ok_or_else(|| {
                    mapper_err(format!(
                        "Failed to parse mapping: normalizer [{n}] not found for field [{full}]"
                    ))
                })?)
            }
        };
        let ignore_above = match p.get("ignore_above") {
            None => None,
            Some(v) => Some(value_str(v).parse::<usize>().map_err(|_| {
                mapper_err(format!(
                    "Failed to parse mapping: For input string: \"{}\"",
                    value_str(v)
                ))
            })?),
        };
        let default_format = if fd.ty == FType::DateNanos {
            "strict_date_optional_time_nanos||epoch_millis"
        } else {
            "strict_date_optional_time||epoch_millis"
        };
        let info = FieldInfo {
            name: full.to_string(),
            ty: fd.ty,
            id: fd.id,
            ignore_above,
            analyzer,
            search_analyzer,
            normalizer,
            index: get_bool("index", fd.ty != FType::Binary)?,
            doc_values: get_bool("doc_values", !matches!(fd.ty, FType::Text | FType::Binary))?,
            null_value: p.get("null_value").cloned(),
            format: p
                .get("format")
                .map(value_str)
                .unwrap_or_else(|| default_format.to_string()),
            coerce: get_bool("coerce", true)?,
            ignore_malformed: get_bool("ignore_malformed", false)?,
            fielddata: get_bool("fielddata", false)?,
        };
        if fd.ty == FType::Text && info.fielddata {
            return Err(EsError::unsupported("fielddata on text fields"));
        }
        if let Some(nv) = &info.null_value
            && !nv.is_null()
        {
            // Check the null value converts.
            let mut out = Vec::new();
            convert_leaf(&info, nv, "null_value", &mut out).map_err(|_| {
                mapper_err(format!("Failed to parse mapping: Error parsing [null_value] on field [{full}]: invalid value"))
            })?;
        }
        Ok(info)
    }

    /// Assigns ids to new fields and rebuilds the lookup tables.
    fn rebuild(&mut self) -> EsResult<()> {
        let mut fields: Vec<Option<FieldInfo>> = Vec::new();
        let mut by_name = HashMap::new();
        let mut objects = HashSet::new();
        let mut next_id = self.next_id;
        let mut root = std::mem::take(&mut self.root.props);
        let r = self.walk_assign(
            &mut root,
            "",
            &mut next_id,
            &mut fields,
            &mut by_name,
            &mut objects,
        );
        self.root.props = root;
        r?;
        self.next_id = next_id;
        let mut v = Vec::with_capacity(fields.len());
        for (i, f) in fields.into_iter().enumerate() {
            v.push(f.unwrap_or_else(|| FieldInfo {
                name: String::new(),
                ty: FType::Binary,
                id: i as u16,
                ignore_above: None,
                analyzer: Analyzer::standard(),
                search_analyzer: Analyzer::standard(),
                normalizer: None,
                index: false,
                doc_values: false,
                null_value: None,
                format: String::new(),
                coerce: true,
                ignore_malformed: false,
                fielddata: false,
            }));
        }
        self.fields = v;
        self.by_name = by_name;
        self.objects = objects;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn walk_assign(
        &self,
        props: &mut BTreeMap<String, Node>,
        prefix: &str,
        next_id: &mut u16,
        fields: &mut Vec<Option<FieldInfo>>,
        by_name: &mut HashMap<String, u16>,
        objects: &mut HashSet<String>,
    ) -> EsResult<()> {
        for (name, node) in props.iter_mut() {
            let full = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}.{name}")
            };
            match node {
                Node::Object(od) => {
                    objects.insert(full.clone());
                    self.walk_assign(&mut od.props, &full, next_id, fields, by_name, objects)?;
                }
                Node::Field(fd) => {
                    self.assign_field(fd, &full, next_id, fields, by_name)?;
                }
            }
        }
        Ok(())
    }

    fn assign_field(
        &self,
        fd: &mut FieldDef,
        full: &str,
        next_id: &mut u16,
        fields: &mut Vec<Option<FieldInfo>>,
        by_name: &mut HashMap<String, u16>,
    ) -> EsResult<()> {
        if fd.id == u16::MAX {
            if *next_id == u16::MAX - 1 {
                return Err(EsError::bad_request(
                    "Limit of total fields has been exceeded",
                ));
            }
            fd.id = *next_id;
            *next_id += 1;
        }
        let info = self.resolve(full, fd)?;
        let id = fd.id as usize;
        if fields.len() <= id {
            fields.resize(id + 1, None);
        }
        fields[id] = Some(info);
        by_name.insert(full.to_string(), fd.id);
        for (sname, sfd) in fd.subfields.iter_mut() {
            self.assign_field(sfd, &format!("{full}.{sname}"), next_id, fields, by_name)?;
        }
        Ok(())
    }

    pub fn field(&self, name: &str) -> Option<&FieldInfo> {
        self.by_name.get(name).map(|&id| &self.fields[id as usize])
    }

    pub fn total_fields(&self) -> usize {
        self.by_name.len() + self.objects.len()
    }

    /// The mapping as GET _mapping shows it.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        if let Some(d) = self.root.dynamic {
            m.insert("dynamic".into(), json!(dyn_str(d)));
        }
        if !self.date_detection {
            m.insert("date_detection".into(), json!(false));
        }
        if self.numeric_detection {
            m.insert("numeric_detection".into(), json!(true));
        }
        for (k, v) in &self.root_extra {
            m.insert(k.clone(), v.clone());
        }
        if !self.root.props.is_empty() {
            m.insert("properties".into(), props_json(&self.root.props));
        }
        Value::Object(m)
    }
}

fn dyn_str(d: Dynamic) -> &'static str {
    match d {
        Dynamic::True => "true",
        Dynamic::False => "false",
        Dynamic::Strict => "strict",
    }
}

fn props_json(props: &BTreeMap<String, Node>) -> Value {
    let mut m = Map::new();
    for (k, n) in props {
        m.insert(k.clone(), node_json(n));
    }
    Value::Object(m)
}

fn node_json(n: &Node) -> Value {
    match n {
        Node::Object(od) => {
            let mut m = Map::new();
            if !od.enabled {
                m.insert("type".into(), json!("object"));
            }
            for (k, v) in &od.params {
                m.insert(k.clone(), v.clone());
            }
            if !od.props.is_empty() {
                m.insert("properties".into(), props_json(&od.props));
            }
            Value::Object(m)
        }
        Node::Field(fd) => field_json(fd),
    }
}

fn field_json(fd: &FieldDef) -> Value {
    let mut m = Map::new();
    m.insert("type".into(), json!(fd.ty.name()));
    for (k, v) in &fd.params {
        m.insert(k.clone(), v.clone());
    }
    if !fd.subfields.is_empty() {
        let mut f = Map::new();
        for (k, s) in &fd.subfields {
            f.insert(k.clone(), field_json(s));
        }
        m.insert("fields".into(), Value::Object(f));
    }
    Value::Object(m)
}

// ---------------------------------------------------------------------------------------
// Indexing a document

/// Indexed values of one field in one document.
#[derive(Debug, Clone)]
pub enum FV {
    /// Keyword terms (after normalizer), in source order.
    Kw(Vec<Box<str>>),
    /// Text tokens: the distinct terms (sorted) with their positions (values of a
    /// multi-valued field are separated by a position gap of 100).
    Text(TextField),
    /// Integers, dates (millis, or nanos for date_nanos) and booleans (0/1).
    Long(Vec<i64>),
    Double(Vec<f64>),
}

#[derive(Debug, Clone, Default)]
pub struct TextField {
    pub terms: Vec<(Box<str>, Vec<u32>)>,
    /// Number of tokens.
    pub len: u32,
}

impl TextField {
    fn build(mut occ: Vec<(Box<str>, u32)>) -> TextField {
        let len = occ.len() as u32;
        occ.sort_unstable();
        let mut terms: Vec<(Box<str>, Vec<u32>)> = Vec::new();
        for (t, p) in occ {
            match terms.last_mut() {
                Some((last, ps)) if *last == t => ps.push(p),
                _ => terms.push((t, vec![p])),
            }
        }
        terms.shrink_to_fit();
        TextField { terms, len }
    }

    pub fn positions(&self, term: &str) -> Option<&[u32]> {
        self.terms
            .binary_search_by(|(t, _)| (**t).cmp(term))
            .ok()
            .map(|i| &self.terms[i].1[..])
    }
}

/// The indexed form of a document: values per field id, sorted by id.
#[derive(Debug, Clone, Default)]
pub struct Indexed {
    pub fields: Vec<(u16, FV)>,
}

impl Indexed {
    pub fn get(&self, id: u16) -> Option<&FV> {
        self.fields
            .binary_search_by_key(&id, |(i, _)| *i)
            .ok()
            .map(|i| &self.fields[i].1)
    }
}

enum Pending {
    Kw(Vec<Box<str>>),
    Text(Vec<(Box<str>, u32)>, u32),
    Long(Vec<i64>),
    Double(Vec<f64>),
}

/// What indexing needs besides the mapping.
pub struct DocCtx<'a> {
    pub id: &'a str,
}

pub enum IndexOutcome {
    Done(Indexed),
    /// New dynamic fields to add (paths and definitions), then index again.
    NeedMapping(Vec<(Vec<String>, Value)>),
}

fn preview(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Object(m) => {
            let parts: Vec<String> = m
                .iter()
                .map(|(k, v)| format!("{k}={}", preview(v)))
                .collect();
            format!("{{{}}}", parts.join(", "))
        }
        Value::Array(a) => format!("[{}]", a.iter().map(preview).collect::<Vec<_>>().join(", ")),
        other => other.to_string(),
    }
}

fn parse_failure(info: &FieldInfo, v: &Value, doc_id: &str, cause: EsError) -> EsError {
    EsError::new(
        400,
        "document_parsing_exception",
        format!(
            "failed to parse field [{}] of type [{}] in document with id '{}'. Preview of field's value: '{}'",
            info.name,
            info.ty.name(),
            doc_id,
            preview(v)
        ),
    )
    .caused_by(cause.flat())
}

const MAX_TERM_BYTES: usize = 32766;

fn immense(field: &str, term: &str) -> EsError {
    let prefix: Vec<String> = term
        .as_bytes()
        .iter()
        .take(30)
        .map(|b| b.to_string())
        .collect();
    EsError::new(
        400,
        "illegal_argument_exception",
        format!(
            "Document contains at least one immense term in field=\"{field}\" (whose UTF8 encoding is longer than the max length {MAX_TERM_BYTES}), all of which were skipped.  Please correct the analyzer to not produce such terms.  The prefix of the first immense term is: '[{}]...', original message: bytes can be at most {MAX_TERM_BYTES} in length; got {}",
            prefix.join(", "),
            term.len()
        ),
    )
    .caused_by(json!({
        "type": "max_bytes_length_exceeded_exception",
        "reason": format!("bytes can be at most {MAX_TERM_BYTES} in length; got {}", term.len())
    }))
}

fn number_as_i64(v: &Value, info: &FieldInfo) -> Result<i64, EsError> {
    let (lo, hi): (i128, i128) = match info.ty {
        FType::Integer => (i32::MIN as i128, i32::MAX as i128),
        FType::Short => (i16::MIN as i128, i16::MAX as i128),
        FType::Byte => (i8::MIN as i128, i8::MAX as i128),
        _ => (i64::MIN as i128, i64::MAX as i128),
    };
    let tyname = match info.ty {
        FType::Integer => "an integer",
        FType::Short => "a short",
        FType::Byte => "a byte",
        _ => "a long",
    };
    let text = match v {
        Value::Number(n) => n.to_string(),
        Value::String(s) if info.coerce => s.trim().to_string(),
        _ => {
            return Err(EsError::bad_request(format!(
                "Current token ({}) not numeric, can not use numeric value accessors",
                token_name(v)
            )));
        }
    };
    let val: i128 = if let Ok(i) = text.parse::<i128>() {
        i
    } else if let Ok(f) = text.parse::<f64>() {
        if !f.is_finite() {
            return Err(EsError::bad_request(format!(
                "[{}] supports only finite values, but got [{f}]",
                info.ty.name()
            )));
        }
        if f.fract() != 0.0 && !info.coerce {
            return Err(EsError::bad_request(format!(
                "Value [{text}] has a decimal part"
            )));
        }
        f.trunc() as i128
    } else {
        return Err(EsError::new(
            400,
            "number_format_exception",
            format!("For input string: \"{text}\""),
        ));
    };
    if val < lo || val > hi {
        return Err(EsError::bad_request(format!(
            "Value [{text}] is out of range for {tyname}"
        )));
    }
    Ok(val as i64)
}

fn token_name(v: &Value) -> &'static str {
    match v {
        Value::String(_) => "VALUE_STRING",
        Value::Bool(true) => "VALUE_TRUE",
        Value::Bool(false) => "VALUE_FALSE",
        Value::Null => "VALUE_NULL",
        Value::Number(_) => "VALUE_NUMBER",
        Value::Object(_) => "START_OBJECT",
        Value::Array(_) => "START_ARRAY",
    }
}

/// Converts one scalar value of a leaf field to indexable terms/numbers.
fn convert_leaf(info: &FieldInfo, v: &Value, doc_id: &str, out: &mut Vec<Pending>) -> EsResult<()> {
    let fail = |cause: EsError| parse_failure(info, v, doc_id, cause);
    match info.ty {
        FType::Keyword => {
            let s = match v {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                _ => {
                    return Err(fail(EsError::bad_request(format!(
                        "Can't get text on a {} at 1:1",
                        token_name(v)
                    ))));
                }
            };
            if let Some(limit) = info.ignore_above
                && s.chars().count() > limit
            {
                return Ok(());
            }
            let s = match &info.normalizer {
                Some(f) => apply_filters(f, &s),
                None => s,
            };
            if s.len() > MAX_TERM_BYTES && (info.index || info.doc_values) {
                return Err(immense(&info.name, &s));
            }
            out.push(Pending::Kw(vec![s.into_boxed_str()]));
        }
        FType::Text => {
            let s = match v {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                _ => {
                    return Err(fail(EsError::bad_request(format!(
                        "Can't get text on a {} at 1:1",
                        token_name(v)
                    ))));
                }
            };
            let toks = info.analyzer.analyze(&s);
            if let Some(t) = toks.iter().find(|t| t.len() > MAX_TERM_BYTES) {
                return Err(immense(&info.name, t));
            }
            let n = toks.len() as u32;
            out.push(Pending::Text(
                toks.into_iter()
                    .enumerate()
                    .map(|(i, t)| (t.into_boxed_str(), i as u32))
                    .collect(),
                n,
            ));
        }
        t if t.is_integer() => match number_as_i64(v, info) {
            Ok(n) => out.push(Pending::Long(vec![n])),
            Err(e) if !info.ignore_malformed => return Err(fail(e)),
            Err(_) => {}
        },
        t if t.is_float() => {
            let r = match v {
                Value::Number(n) => n
                    .as_f64()
                    .ok_or_else(|| EsError::bad_request("not a number")),
                Value::String(s) if info.coerce => s.trim().parse::<f64>().map_err(|_| {
                    EsError::new(
                        400,
                        "number_format_exception",
                        format!("For input string: \"{s}\""),
                    )
                }),
                _ => Err(EsError::bad_request(format!(
                    "Current token ({}) not numeric",
                    token_name(v)
                ))),
            };
            match r {
                Ok(f) if f.is_finite() => {
                    let f = if t == FType::Float {
                        f as f32 as f64
                    } else {
                        f
                    };
                    out.push(Pending::Double(vec![f]));
                }
                Ok(f) if !info.ignore_malformed => {
                    return Err(fail(EsError::bad_request(format!(
                        "[{}] supports only finite values, but got [{f}]",
                        t.name()
                    ))));
                }
                Err(e) if !info.ignore_malformed => return Err(fail(e)),
                _ => {}
            }
        }
        FType::Date | FType::DateNanos => {
            let nanos = match v {
                Value::Number(n) => {
                    if let Some(i) = n.as_i64() {
                        Some(i as i128 * 1_000_000)
                    } else {
                        n.as_f64().map(|f| (f * 1e6) as i128)
                    }
                }
                Value::String(s) => time::parse_date_nanos(s, &info.format),
                _ => None,
            };
            match nanos {
                Some(ns) => {
                    let val = if info.ty == FType::DateNanos {
                        if ns < 0 {
                            if info.ignore_malformed {
                                return Ok(());
                            }
                            return Err(fail(EsError::bad_request(format!(
                                "date[{}] is before the epoch in 1970 and cannot be stored in nanosecond resolution",
                                preview(v)
                            ))));
                        }
                        ns as i64
                    } else {
                        ns.div_euclid(1_000_000) as i64
                    };
                    out.push(Pending::Long(vec![val]));
                }
                None if info.ignore_malformed => {}
                None => {
                    return Err(fail(EsError::bad_request(format!(
                        "failed to parse date field [{}] with format [{}]",
                        preview(v),
                        info.format
                    ))));
                }
            }
        }
        FType::Boolean => {
            let b = match v {
                Value::Bool(b) => Some(*b),
                Value::String(s) if s == "true" => Some(true),
                Value::String(s) if s == "false" || s.is_empty() => Some(false),
                _ => None,
            };
            match b {
                Some(b) => out.push(Pending::Long(vec![b as i64])),
                None if info.ignore_malformed => {}
                None => {
                    return Err(fail(EsError::bad_request(format!(
                        "Failed to parse value [{}] as only [true] or [false] are allowed.",
                        preview(v)
                    ))));
                }
            }
        }
        FType::Binary => {
            if let Value::String(s) = v {
                use base64::Engine;
                if base64::engine::general_purpose::STANDARD
                    .decode(s.trim())
                    .is_err()
                {
                    return Err(fail(EsError::bad_request(
                        "Failed to decode VALUE_STRING as base64",
                    )));
                }
            } else {
                return Err(fail(EsError::bad_request(format!(
                    "Current token ({}) not binary",
                    token_name(v)
                ))));
            }
        }
        _ => unreachable!(),
    }
    Ok(())
}

struct Indexer<'a> {
    m: &'a Mapping,
    doc_id: &'a str,
    acc: BTreeMap<u16, Pending>,
    new: Vec<(Vec<String>, Value)>,
}

impl Indexer<'_> {
    fn add(&mut self, id: u16, p: Pending) {
        match (self.acc.get_mut(&id), p) {
            (None, p) => {
                self.acc.insert(id, p);
            }
            (Some(Pending::Kw(a)), Pending::Kw(b)) => a.extend(b),
            (Some(Pending::Long(a)), Pending::Long(b)) => a.extend(b),
            (Some(Pending::Double(a)), Pending::Double(b)) => a.extend(b),
            (Some(Pending::Text(a, next)), Pending::Text(b, n)) => {
                let base = *next + 100;
                a.extend(b.into_iter().map(|(t, p)| (t, p + base)));
                *next = base + n;
            }
            _ => {}
        }
    }

    fn leaf(&mut self, fd: &FieldDef, v: &Value) -> EsResult<()> {
        let info = &self.m.fields[fd.id as usize];
        match v {
            Value::Array(a) => {
                for x in a {
                    self.leaf(fd, x)?;
                }
                return Ok(());
            }
            Value::Null => {
                if let Some(nv) = info.null_value.clone()
                    && !nv.is_null()
                {
                    return self.leaf(fd, &nv);
                }
                return Ok(());
            }
            _ => {}
        }
        let mut out = Vec::new();
        convert_leaf(info, v, self.doc_id, &mut out)?;
        for p in out {
            self.add(fd.id, p);
        }
        for sfd in fd.subfields.values() {
            let sinfo = &self.m.fields[sfd.id as usize];
            let mut out = Vec::new();
            match convert_leaf(sinfo, v, self.doc_id, &mut out) {
                Ok(()) => {}
                Err(e) if e.kind == "illegal_argument_exception" => return Err(e),
                Err(e) => return Err(e),
            }
            for p in out {
                self.add(sfd.id, p);
            }
        }
        Ok(())
    }

    fn object(
        &mut self,
        od: &ObjectDef,
        path: &[String],
        obj: &Map<String, Value>,
        dynamic: Dynamic,
    ) -> EsResult<()> {
        let dynamic = od.dynamic.unwrap_or(dynamic);
        for (key, v) in obj {
            if key.is_empty() {
                return Err(EsError::new(
                    400,
                    "document_parsing_exception",
                    "field name cannot be an empty string".to_string(),
                ));
            }
            let parts: Vec<&str> = key.split('.').collect();
            if parts.iter().any(|p| p.is_empty()) {
                return Err(EsError::new(
                    400,
                    "document_parsing_exception",
                    format!("field name cannot contain only whitespace or dots: ['{key}']"),
                ));
            }
            self.entry(od, path, &parts, v, dynamic)?;
        }
        Ok(())
    }

    fn entry(
        &mut self,
        od: &ObjectDef,
        path: &[String],
        parts: &[&str],
        v: &Value,
        dynamic: Dynamic,
    ) -> EsResult<()> {
        let name = parts[0];
        let mut full_path: Vec<String> = path.to_vec();
        full_path.push(name.to_string());
        let full = full_path.join(".");
        match od.props.get(name) {
            Some(Node::Object(child)) => {
                if !child.enabled {
                    return Ok(());
                }
                if parts.len() > 1 {
                    return self.entry(
                        child,
                        &full_path,
                        &parts[1..],
                        v,
                        child.dynamic.unwrap_or(dynamic),
                    );
                }
                self.object_value(child, &full_path, &full, v, dynamic)
            }
            Some(Node::Field(fd)) => {
                if parts.len() > 1 {
                    // `a.b` where `a` is a leaf: Elasticsearch rejects it.
                    return Err(EsError::new(
                        400,
                        "document_parsing_exception",
                        format!(
                            "Could not dynamically add mapping for field [{}]. Existing mapping for [{full}] must be of type object but found [{}].",
                            parts.join("."),
                            fd.ty.name()
                        ),
                    ));
                }
                if let Value::Object(_) = v {
                    let info = &self.m.fields[fd.id as usize];
                    return Err(parse_failure(
                        info,
                        v,
                        self.doc_id,
                        EsError::bad_request("Can't get text on a START_OBJECT at 1:1".to_string()),
                    ));
                }
                self.leaf(fd, v)
            }
            None => match dynamic {
                Dynamic::False => Ok(()),
                Dynamic::Strict => {
                    let within = if path.is_empty() {
                        "_doc".to_string()
                    } else {
                        path.join(".")
                    };
                    Err(EsError::new(
                        400,
                        "strict_dynamic_mapping_exception",
                        format!(
                            "[1:2] mapping set to strict, dynamic introduction of [{name}] within [{within}] is not allowed"
                        ),
                    ))
                }
                Dynamic::True => {
                    if parts.len() > 1 {
                        self.new.push((full_path, json!({"properties": {}})));
                        return Ok(());
                    }
                    if let Some(def) = self.infer(v) {
                        self.new.push((full_path, def));
                    }
                    Ok(())
                }
            },
        }
    }

    fn object_value(
        &mut self,
        od: &ObjectDef,
        path: &[String],
        full: &str,
        v: &Value,
        dynamic: Dynamic,
    ) -> EsResult<()> {
        match v {
            Value::Object(o) => self.object(od, path, o, dynamic),
            Value::Array(a) => {
                for x in a {
                    self.object_value(od, path, full, x, dynamic)?;
                }
                Ok(())
            }
            Value::Null => Ok(()),
            other => Err(EsError::new(
                400,
                "document_parsing_exception",
                format!(
                    "object mapping for [{full}] tried to parse field [{}] as object, but found a concrete value",
                    path.last().map(String::as_str).unwrap_or(full)
                ),
            )
            .with("preview", preview(other))),
        }
    }

    /// The dynamic mapping for a new field's value (None for null / empty arrays).
    fn infer(&self, v: &Value) -> Option<Value> {
        Some(match v {
            Value::Null => return None,
            Value::Array(a) => return a.iter().find_map(|x| self.infer(x)),
            Value::Bool(_) => json!({"type": "boolean"}),
            Value::Number(n) => {
                if n.is_i64() || n.is_u64() {
                    json!({"type": "long"})
                } else {
                    json!({"type": "float"})
                }
            }
            Value::Object(_) => json!({"properties": {}}),
            Value::String(s) => {
                if self.m.date_detection && looks_like_date(s) {
                    json!({"type": "date"})
                } else if self.m.numeric_detection && s.trim().parse::<i64>().is_ok() {
                    json!({"type": "long"})
                } else if self.m.numeric_detection && s.trim().parse::<f64>().is_ok() {
                    json!({"type": "float"})
                } else {
                    json!({"type": "text", "fields": {"keyword": {"type": "keyword", "ignore_above": 256}}})
                }
            }
        })
    }
}

fn looks_like_date(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 10
        && b[4] == b'-'
        && b[7] == b'-'
        && b[..4].iter().all(u8::is_ascii_digit)
        && time::parse_iso_nanos(s).is_some()
        || time::parse_date_nanos(s, "yyyy/MM/dd HH:mm:ss||yyyy/MM/dd").is_some()
}

impl Mapping {
    /// Indexes a parsed source. New dynamic fields are reported (not added): the caller
    /// adds them with [`Mapping::add_dynamic`] and indexes again.
    pub fn index_doc(&self, source: &Value, ctx: &DocCtx) -> EsResult<IndexOutcome> {
        let Value::Object(obj) = source else {
            return Err(EsError::new(
                400,
                "document_parsing_exception",
                "[1:1] failed to parse: Root value must be an object",
            ));
        };
        let mut ix = Indexer {
            m: self,
            doc_id: ctx.id,
            acc: BTreeMap::new(),
            new: vec![],
        };
        ix.object(&self.root, &[], obj, self.root_dynamic())?;
        if !ix.new.is_empty() {
            let mut seen = HashSet::new();
            let new: Vec<_> = ix
                .new
                .into_iter()
                .filter(|(p, _)| seen.insert(p.clone()))
                .collect();
            return Ok(IndexOutcome::NeedMapping(new));
        }
        let fields = ix
            .acc
            .into_iter()
            .map(|(id, p)| {
                (
                    id,
                    match p {
                        Pending::Kw(v) => FV::Kw(v),
                        Pending::Text(v, _) => FV::Text(TextField::build(v)),
                        Pending::Long(v) => FV::Long(v),
                        Pending::Double(v) => FV::Double(v),
                    },
                )
            })
            .collect();
        Ok(IndexOutcome::Done(Indexed { fields }))
    }

    /// Adds dynamically detected fields (full paths) to the mapping.
    pub fn add_dynamic(&mut self, new: &[(Vec<String>, Value)], limit: usize) -> EsResult<()> {
        for (path, def) in new {
            // Rebuild the nesting correctly from the innermost definition outwards.
            let mut node = def.clone();
            for seg in path[1..].iter().rev() {
                let mut p = Map::new();
                p.insert(seg.clone(), node);
                node = json!({"properties": Value::Object(p)});
            }
            let mut props = Map::new();
            props.insert(path[0].clone(), node);
            let mut root = std::mem::take(&mut self.root.props);
            let r = self.merge_props(&mut root, &props, "");
            self.root.props = root;
            r?;
        }
        self.rebuild()?;
        if self.total_fields() > limit {
            return Err(EsError::bad_request(format!(
                "Limit of total fields [{limit}] has been exceeded"
            )));
        }
        Ok(())
    }
}
