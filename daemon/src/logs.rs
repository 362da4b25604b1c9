//! Logging set-up shared by the daemons.

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// The `--log-format` flag every fedge command takes, flattened into its `Cli`.
#[derive(clap::Args, Debug, Clone, PartialEq)]
#[command(next_help_heading = "Logging")]
pub struct LogArgs {
    /// Log line format (RUST_LOG chooses what is logged).
    #[arg(long, value_enum, global = true, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Installs the global subscriber, writing to standard output: `RUST_LOG` when set, else
/// `default_filter` (e.g. `"info"`).
pub fn init_logs(format: LogFormat, default_filter: &str) {
    use std::io::IsTerminal;
    let colour = colour(std::io::stdout().is_terminal());
    init_logs_to(format, default_filter, std::io::stdout, colour);
}

/// Whether text logs are coloured: only on a terminal, and never with `NO_COLOR` set
/// (no-color.org), so a log file or a journal holds no escape codes.
pub fn colour(terminal: bool) -> bool {
    terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// [`init_logs`] with another destination, e.g. `std::io::stderr` for a command whose standard
/// output is its result; `colour` as [`colour`] says for that destination.
pub fn init_logs_to<W>(format: LogFormat, default_filter: &str, writer: W, colour: bool)
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(writer);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
