//! The shared scope vectors (`shared/testdata/scope-vectors.json`, written by an
//! independent Python implementation): the JWKS and the tokens the end-to-end tests
//! send, signed there.

/// The vectors' document.
pub fn document() -> serde_json::Value {
    serde_json::from_str(include_str!("../../shared/testdata/scope-vectors.json"))
        .expect("the scope vectors are JSON")
}

/// The `Authorization` value of the vector named `name`.
pub fn authorization(name: &str) -> String {
    let doc = document();
    let vector = doc["vectors"]
        .as_array()
        .expect("a list of vectors")
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no scope vector {name:?}"));
    vector["headers"]["authorization"]
        .as_str()
        .expect("a single Authorization value")
        .to_owned()
}
