//! `--seeds`, spelt one way by every command that takes it: a count (`5`: seeds 0 to 4), a
//! range (`100..120`: seeds 100 to 119) or a list (`3,7,11`).

use std::str::FromStr;

/// The seeds a command runs, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seeds(pub Vec<u64>);

impl FromStr for Seeds {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let number = |v: &str| {
            v.trim().parse::<u64>().map_err(|_| {
                format!(
                    "`{v}` is not a seed: give a count (5), a range (100..120) or a list (3,7,11)"
                )
            })
        };
        let seeds: Vec<u64> = if let Some((from, to)) = s.split_once("..") {
            let (from, to) = (number(from)?, number(to)?);
            if from >= to {
                return Err(format!(
                    "the range {from}..{to} holds no seed: the end is excluded, as in 100..120"
                ));
            }
            (from..to).collect()
        } else if s.contains(',') {
            (s.split(',').filter(|v| !v.trim().is_empty()))
                .map(number)
                .collect::<Result<_, _>>()?
        } else {
            (0..number(s)?).collect()
        };
        if seeds.is_empty() {
            return Err("no seed: give a count (5), a range (100..120) or a list (3,7,11)".into());
        }
        Ok(Seeds(seeds))
    }
}

#[cfg(test)]
mod tests {
    use super::Seeds;

    #[test]
    fn a_count_a_range_and_a_list_parse_and_nonsense_says_what_to_give() {
        assert_eq!("3".parse::<Seeds>().unwrap().0, [0, 1, 2]);
        assert_eq!("100..103".parse::<Seeds>().unwrap().0, [100, 101, 102]);
        assert_eq!("7,3, 11".parse::<Seeds>().unwrap().0, [7, 3, 11]);
        assert_eq!("9,".parse::<Seeds>().unwrap().0, [9]);
        for bad in ["0", "5..5", "a", "1..x", ","] {
            let e = bad.parse::<Seeds>().unwrap_err();
            assert!(
                e.contains("(100..120)") || e.contains("100..120"),
                "{bad}: {e}"
            );
        }
    }
}
