//! The local front door: `tandem_api::manifest::parse` applies the CRD's generated schema and CEL
//! rules, so a manifest the API server refuses is refused here with the API server's wording.
#![allow(clippy::expect_used, clippy::unwrap_used)] // tests fail loudly by design

use crate::common;

use tandem_api::manifest;

#[test]
fn schema_violations_are_refused_with_the_api_servers_message() {
    let fixtures = common::yaml_files(&common::workspace().join("api/tests/fixtures/schema"));
    assert!(fixtures.len() >= 10, "expected at least 10 schema fixtures, found {}", fixtures.len());
    for (path, text) in fixtures {
        let expected = common::expected_message(&path, &text);
        let err = manifest::parse(&text).expect_err(&format!("{} should be refused", path.display()));
        assert!(err.to_string().contains(&expected), "{}: expected {expected:?}, got {err}", path.display());
    }
}

#[test]
fn examples_are_admitted_with_defaults_applied() {
    for (path, text) in common::examples() {
        let job = manifest::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(job.spec.workers.max_groups >= 1, "{}", path.display());
    }
}

#[test]
fn every_problem_is_reported_at_once() {
    let err = manifest::parse(
        "apiVersion: tandem.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: two}\nspec:\n  training: {algorithm: allreduce, steps: 0, staleness: 5000}\n",
    )
    .expect_err("two problems");
    assert_eq!(err.problems.len(), 2, "{err}");
}

#[test]
fn integral_floats_are_integers_as_on_the_api_server() {
    let job = manifest::parse(
        "apiVersion: tandem.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: f}\nspec:\n  data: {source: synthetic, syntheticSamples: 2e3}\n  training: {algorithm: allreduce, steps: 1e1}\n",
    )
    .expect("integral floats are integers");
    assert_eq!(job.spec.training.steps, Some(10));
    assert_eq!(job.spec.data.synthetic_samples, Some(2000));
}

#[test]
fn a_field_given_as_null_counts_as_unset_as_on_the_api_server() {
    // The API server prunes these (the installed CRD makes them non-nullable) and admits the job.
    let job = manifest::parse(
        "apiVersion: tandem.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: nulls}\nspec:\n  \
         data: {source: mnist5k, tokens: null, path: null, batchSize: null}\n  model: {kind: mlp, depth: null}\n  \
         training: {algorithm: allreduce, steps: 10, epochs: null}\n",
    )
    .unwrap_or_else(|e| panic!("refused: {e}"));
    assert_eq!(job.spec.data.path, None);
    assert_eq!(job.spec.training.epochs, None);
    assert_eq!(job.spec.data.batch_size, 64, "an unset batchSize takes its default");
}

/// `tandem train -f` refuses a name one character too long for the launcher of the highest group
/// (`<name>-g1023-launcher` must fit a 63-character host name) and admits one of exactly the limit.
#[test]
fn a_name_is_bounded_by_its_longest_pod_host_name() {
    let job = |name: &str| {
        format!(
            "apiVersion: tandem.dev/v1alpha1\nkind: TrainingJob\nmetadata: {{name: {name}}}\n\
             spec:\n  training: {{algorithm: allreduce, steps: 10}}\n"
        )
    };
    let longest = "a".repeat(tandem_api::MAX_NAME);
    assert_eq!(longest.len() + "-g1023-launcher".len(), 63);
    manifest::parse(&job(&longest)).unwrap_or_else(|e| panic!("a {}-character name: {e}", longest.len()));
    let err = manifest::parse(&job(&format!("{longest}b"))).expect_err("one character more is refused");
    let text = err.to_string();
    assert!(text.contains("at most 48 lower-case letters"), "{text}");
    assert!(text.contains("<name>-g1023-launcher"), "{text}");
}
