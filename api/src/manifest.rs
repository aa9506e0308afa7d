//! Validation of a TrainingJob manifest without an API server: the CRD's own generated schema
//! (types, bounds, enums, required and unknown fields) and its CEL rules, applied in the order the
//! API server applies them, so that `tandem train -f` and `kubectl apply -f` refuse the same
//! manifests with the same messages.
//!
//! Expected flow: the local runner calls [`parse`] on the manifest's text and trains the
//! [`TrainingJob`] it returns; [`crate::TrainingJobSpec::validate`] runs the same checks on a
//! spec already in memory.
//!
//! Guarantees: the schema is [`crate::crd::as_written`], the one `crdgen` writes into `crds/`
//! before the spec's rules are compiled into one for the API server, so a rule added to the types
//! reaches both front doors at once with the same message. Every problem found is reported, each
//! prefixed with the field path of the object the rule is about (`spec.data: …`; the API server
//! names `spec` for the compiled rules).

use std::sync::OnceLock;

use serde_json::Value;

use crate::job::{GROUP, TrainingJob, VERSION};

/// A manifest that the API server would refuse; one line per problem.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{}", .problems.join("; "))]
pub struct ManifestError {
    /// What is wrong, each with the field it concerns.
    pub problems: Vec<String>,
}

impl ManifestError {
    fn one(problem: String) -> Self {
        Self { problems: vec![problem] }
    }
}

/// Parses and validates a `tandem.dev/v1alpha1` TrainingJob manifest (YAML or JSON), defaults
/// applied, as the API server would admit it.
pub fn parse(text: &str) -> Result<TrainingJob, ManifestError> {
    let object: Value = serde_yaml::from_str(text)
        .map_err(|e| ManifestError::one(format!("the manifest is not valid YAML: {e}")))?;
    let object = admit(object)?;
    if object.pointer("/metadata/name").and_then(Value::as_str).is_none_or(str::is_empty) {
        return Err(ManifestError::one(
            "metadata.name: Required value: name the job (it names its output folder and pods)".to_owned(),
        ));
    }
    serde_json::from_value(object)
        .map_err(|e| ManifestError::one(format!("the manifest does not decode as a TrainingJob: {e}")))
}

/// Checks a whole object (`apiVersion`, `kind`, `metadata`, `spec`) and returns it with the
/// schema's defaults applied and integral numbers normalised to integers. A field given as `null`
/// counts as unset, as on the API server (which prunes it, or keeps it and answers `has()` false).
pub fn admit(mut object: Value) -> Result<Value, ManifestError> {
    drop_nulls(&mut object);
    let Value::Object(fields) = &object else {
        return Err(ManifestError::one(
            "the manifest must be a mapping with apiVersion, kind, metadata and spec".to_owned(),
        ));
    };
    let api_version = fields.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = fields.get("kind").and_then(Value::as_str).unwrap_or("");
    let expected = format!("{GROUP}/{VERSION}");
    if api_version != expected || kind != "TrainingJob" {
        return Err(ManifestError::one(format!(
            "apiVersion is {api_version:?} and kind is {kind:?}: this is not a TrainingJob; set apiVersion: \
             {expected} and kind: TrainingJob"
        )));
    }
    let mut problems = Vec::new();
    let schema = schema();
    let mut object = kube_cel::apply_defaults(schema, &object);
    if let Value::Object(fields) = &mut object {
        for (key, value) in fields.iter_mut() {
            match key.as_str() {
                "apiVersion" | "kind" => {}
                "metadata" if value.is_object() => {}
                "metadata" => problems.push("metadata: must be a mapping".to_owned()),
                _ => match schema.pointer(&format!("/properties/{}", escape(key))) {
                    Some(sub) => structural(sub, value, key, &mut problems),
                    None => problems.push(format!("unknown field {key:?}")),
                },
            }
        }
        if !fields.contains_key("spec") {
            problems.push("spec: Required value".to_owned());
        }
    }
    if problems.is_empty()
        && let Err(errors) = kube_cel::Validator::new().validate(schema, &object, None)
    {
        problems.extend(errors.iter().map(|e| {
            let path = if e.field_path.is_empty() { "<root>" } else { e.field_path.as_str() };
            format!("{path}: Invalid value: \"object\": {}", e.message)
        }));
    }
    if problems.is_empty() { Ok(object) } else { Err(ManifestError { problems }) }
}

/// The CRD's `openAPIV3Schema`, generated once.
fn schema() -> &'static Value {
    static SCHEMA: OnceLock<Value> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        serde_json::to_value(crate::crd::as_written())
            .ok()
            .and_then(|crd| crd.pointer("/spec/versions/0/schema/openAPIV3Schema").cloned())
            .unwrap_or(Value::Null)
    })
}

/// Removes every field whose value is `null`, at any depth.
fn drop_nulls(value: &mut Value) {
    match value {
        Value::Object(fields) => {
            fields.retain(|_, v| !v.is_null());
            fields.values_mut().for_each(drop_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// The API server's structural checks of `value` against `schema`, at `path`, with its wording.
/// Integral floats (`4e9` in YAML) become integers where the schema asks for one, as the API
/// server accepts them.
fn structural(schema: &Value, value: &mut Value, path: &str, out: &mut Vec<String>) {
    let flag = |name: &str| schema.get(name).and_then(Value::as_bool).unwrap_or(false);
    if value.is_null() {
        if !flag("nullable") {
            out.push(format!("{path}: Invalid value: \"null\": {path} in body must not be null"));
        }
        return;
    }
    if flag("x-kubernetes-int-or-string") {
        if !(value.is_string() || value.is_i64() || value.is_u64()) {
            out.push(format!(
                "{path}: Invalid value: {value}: {path} in body must be an integer or a string"
            ));
        }
        return;
    }
    let ty = schema.get("type").and_then(Value::as_str).unwrap_or("");
    if ty == "integer"
        && let Some(f) = value.as_f64()
        && !(value.is_i64() || value.is_u64())
        && f.fract() == 0.0
        && f.abs() < 9.0e18
    {
        // An integral float; the bounds below catch what does not fit.
        *value = if f < 0.0 { Value::from(f as i64) } else { Value::from(f as u64) };
    }
    if ty == "number"
        && (value.is_i64() || value.is_u64())
        && let Some(f) = value.as_f64()
        && let Some(n) = serde_json::Number::from_f64(f)
    {
        // The API server's CEL sees a number field as a double, `1` as `1.0`.
        *value = Value::Number(n);
    }
    let fits = match ty {
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "object" => value.is_object(),
        "array" => value.is_array(),
        _ => true,
    };
    if !fits {
        out.push(format!("{path}: Invalid value: {value}: {path} in body must be of type {ty}"));
        return;
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        let list: Vec<String> = allowed.iter().map(Value::to_string).collect();
        out.push(format!("{path}: Unsupported value: {value}: supported values: {}", list.join(", ")));
    }
    if let Some(n) = value.as_f64() {
        if let Some(min) = schema.get("minimum").and_then(Value::as_f64)
            && n < min
        {
            out.push(format!(
                "{path}: Invalid value: {value}: {path} in body should be greater than or equal to {min}"
            ));
        }
        if let Some(max) = schema.get("maximum").and_then(Value::as_f64)
            && n > max
        {
            out.push(format!(
                "{path}: Invalid value: {value}: {path} in body should be less than or equal to {max}"
            ));
        }
    }
    let bound = |name: &str| schema.get(name).and_then(Value::as_u64);
    match value {
        Value::String(s) => {
            let len = s.chars().count() as u64;
            if let Some(min) = bound("minLength")
                && len < min
            {
                out.push(format!(
                    "{path}: Invalid value: {value}: {path} in body should be at least {min} chars long"
                ));
            } else if let Some(max) = bound("maxLength")
                && len > max
            {
                out.push(format!("{path}: Too long: may not be more than {max} bytes"));
            }
        }
        Value::Array(items) => {
            let len = items.len() as u64;
            if let Some(max) = bound("maxItems")
                && len > max
            {
                out.push(format!("{path}: Too many: {len}: must have at most {max} items"));
            }
            if let Some(min) = bound("minItems")
                && len < min
            {
                out.push(format!(
                    "{path}: Invalid value: {len}: {path} in body should have at least {min} items"
                ));
            }
            if let Some(item) = schema.get("items") {
                for (i, v) in items.iter_mut().enumerate() {
                    structural(item, v, &format!("{path}[{i}]"), out);
                }
            }
        }
        Value::Object(fields) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let extra = schema.get("additionalProperties").filter(|v| v.is_object());
            let open =
                flag("x-kubernetes-preserve-unknown-fields") || (properties.is_none() && extra.is_none());
            for required in schema.get("required").and_then(Value::as_array).into_iter().flatten() {
                if let Some(key) = required.as_str()
                    && !fields.contains_key(key)
                {
                    out.push(format!("{path}.{key}: Required value"));
                }
            }
            for (key, v) in fields.iter_mut() {
                let sub = format!("{path}.{key}");
                match (properties.and_then(|p| p.get(key)), extra) {
                    (Some(s), _) | (None, Some(s)) => structural(s, v, &sub, out),
                    (None, None) if open => {}
                    (None, None) => out.push(format!(
                        "unknown field {sub:?}: the TrainingJob schema has no such field; check its spelling \
                         (`kubectl explain trainingjob.{}`)",
                        path.trim_start_matches('.')
                    )),
                }
            }
        }
        _ => {}
    }
}
