//! The daemons' command lines checked the same way: every subcommand says what it does, in
//! words of its own (a doc comment on the wrong variant once left one blank and gave another
//! its text).

/// What is wrong with `cli`'s help: clap's own consistency checks panic; each subcommand
/// without a help line, or repeating another's, is named.
pub fn help_problems(cli: &clap::Command) -> Vec<String> {
    cli.clone().debug_assert();
    let mut seen = std::collections::BTreeSet::new();
    let mut problems = Vec::new();
    for sub in cli.get_subcommands().filter(|s| s.get_name() != "help") {
        let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
        if about.is_empty() {
            problems.push(format!("`{}` has no help line", sub.get_name()));
        } else if !seen.insert(about.clone()) {
            problems.push(format!(
                "`{}` repeats another's help: {about}",
                sub.get_name()
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blank_or_repeated_help_line_is_named() {
        let cli = clap::Command::new("t")
            .subcommand(clap::Command::new("a").about("does a"))
            .subcommand(clap::Command::new("b"))
            .subcommand(clap::Command::new("c").about("does a"));
        assert_eq!(
            help_problems(&cli),
            ["`b` has no help line", "`c` repeats another's help: does a"]
        );
    }
}
