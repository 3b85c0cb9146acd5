//! The policy file as written: principals by name, each with its
//! [`Rules`]. A name given twice is refused.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::policy::rules::Rules;

/// The document: `{"principals": {name: rules}}`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PolicyFile {
    #[serde(deserialize_with = "unique_principals")]
    pub(crate) principals: BTreeMap<String, Rules>,
}

/// The principals, refusing a name given twice (JSON maps would otherwise
/// keep the last silently, hiding the first one's rights from a reader of
/// the file).
fn unique_principals<'de, D>(deserializer: D) -> Result<BTreeMap<String, Rules>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    struct Unique;
    impl<'de> serde::de::Visitor<'de> for Unique {
        type Value = BTreeMap<String, Rules>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object of principals by name")
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            let mut principals = BTreeMap::new();
            while let Some((name, rules)) = map.next_entry::<String, Rules>()? {
                if principals.contains_key(&name) {
                    return Err(serde::de::Error::custom(format!(
                        "principal {name:?} is named twice"
                    )));
                }
                principals.insert(name, rules);
            }
            Ok(principals)
        }
    }
    deserializer.deserialize_map(Unique)
}
