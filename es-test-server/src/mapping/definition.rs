//! Mapping definitions: the empty mapping, parsing and merging a mapping body (create index,
//! PUT _mapping), resolving each field's analysis and parameters, and rendering (GET _mapping).

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::{Map, Value, json};

use crate::analysis::{Analysis, Analyzer};
use crate::error::{EsError, EsResult};

use super::document::convert_leaf;
use super::{
    Dynamic, FType, FieldDef, FieldInfo, Mapping, Node, ObjectDef, as_bool_param, mapper_err,
    parse_dynamic, value_str,
};

impl Mapping {
    pub(crate) fn empty(analysis: Analysis) -> Mapping {
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

    pub(crate) fn root_dynamic(&self) -> Dynamic {
        self.root.dynamic.unwrap_or(Dynamic::True)
    }

    /// Merges a `mappings` body (index creation or PUT _mapping) into this mapping.
    pub(crate) fn merge_json(&mut self, body: &Value) -> EsResult<()> {
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

    pub(super) fn merge_props(
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
            store: get_bool("store", false)?,
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
    pub(super) fn rebuild(&mut self) -> EsResult<()> {
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
                store: false,
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

    pub(crate) fn field(&self, name: &str) -> Option<&FieldInfo> {
        self.by_name.get(name).map(|&id| &self.fields[id as usize])
    }

    pub(crate) fn total_fields(&self) -> usize {
        self.by_name.len() + self.objects.len()
    }

    /// The mapping as GET _mapping shows it.
    pub(crate) fn to_json(&self) -> Value {
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
