//! Closed sets of names read from TOML and the command line (`strategy`, `solver`, `robust`):
//! one macro gives each the same derives (serde, clap and a JSON Schema, kebab-case), a `name()`,
//! `ALL`, `Display` and a `FromStr` whose error lists the valid
//! names, so every set is spelled one way everywhere. Nothing else lives here.

/// Declares a closed set: `closed_set! { /// doc  pub enum Kind("what") { /// doc  A = "a", … } }`.
/// The spelled names must be the variants' kebab-case (serde's and clap's); a test in
/// `strategy::tests` checks it for every set.
macro_rules! closed_set {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident($what:literal) {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(
            Debug,
            Clone,
            Copy,
            PartialEq,
            Eq,
            Default,
            serde::Serialize,
            serde::Deserialize,
            clap::ValueEnum,
            schemars::JsonSchema,
        )]
        #[serde(rename_all = "kebab-case")]
        $vis enum $name {
            $( $(#[$vmeta])* $variant ),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &[Self] = &[$(Self::$variant),+];

            /// Name in TOML, on the command line and in JSON.
            pub fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => $text),+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl std::str::FromStr for $name {
            type Err = fedge_wire::UnknownName;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                let all = Self::ALL.iter().copied();
                all.clone()
                    .find(|k| k.name() == s)
                    .ok_or_else(|| fedge_wire::UnknownName::new($what, s, all.map(Self::name)))
            }
        }
    };
}

pub(crate) use closed_set;
