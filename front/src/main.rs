//! `fedge`: the front end's binary. It parses the command line and hands it to the command's
//! module in `cli/`; it computes nothing itself.

mod cli;

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    cli::args::init_logs(&cli.log);
    let done = cli.command.run().await;
    fedge_daemon::exit::finish(done.map(|()| std::process::ExitCode::SUCCESS))
}
