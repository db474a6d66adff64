"""One module per `unlearn` sub-command: ``add_parser(subparsers)`` builds its parser and
sets ``func``; heavy imports happen inside the function so `unlearn --help` stays fast. A
benchmark adds its own verbs the same way (``Benchmark.commands``)."""

#: modules in the order `unlearn --help` lists them
COMMANDS = (
    "demo",
    "study",
    "records",
    "probs",
    "score",
    "stratify",
    "plugins",
    "run",
    "finetune",
    "eval",
    "logs",
    "attack",
    "plan",
)
