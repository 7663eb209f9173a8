//! Every argument of every command has a help text: `dshdb CMD --help` must say what each
//! positional argument and flag is, so the command tree is walked and checked here.

use crate::Cli;
use clap::CommandFactory;

/// The arguments without a help text, as `command path: argument id`.
fn missing_help(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
    for argument in command.get_arguments() {
        // clap's own `--help` / `--version` carry clap's text.
        let builtin = matches!(argument.get_id().as_str(), "help" | "version");
        let described = argument.get_help().is_some() || argument.get_long_help().is_some();
        if !builtin && !described {
            missing.push(format!("{path}: {}", argument.get_id()));
        }
    }
    for subcommand in command.get_subcommands() {
        let sub_path = format!("{path} {}", subcommand.get_name());
        if subcommand.get_about().is_none() && subcommand.get_name() != "help" {
            missing.push(format!("{sub_path}: (no about text)"));
        }
        missing_help(subcommand, &sub_path, missing);
    }
}

#[test]
fn every_argument_and_command_has_a_help_text() {
    let mut command = Cli::command();
    command.build();
    let mut missing = Vec::new();
    missing_help(&command, "dshdb", &mut missing);
    assert!(missing.is_empty(), "no help text:\n{}", missing.join("\n"));
}

/// The walk sees positional arguments and flags alike: a command with an undocumented
/// argument is reported.
#[test]
fn the_walk_reports_an_undocumented_argument() {
    let command = clap::Command::new("probe")
        .arg(clap::Arg::new("store"))
        .arg(
            clap::Arg::new("documented")
                .long("documented")
                .help("has one"),
        );
    let mut missing = Vec::new();
    missing_help(&command, "probe", &mut missing);
    assert_eq!(missing, ["probe: store"]);
}
