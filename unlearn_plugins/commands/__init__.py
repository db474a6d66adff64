"""One module per `unlearn` sub-command: ``add_parser(subparsers)`` builds its parser and
sets ``func``; heavy imports happen inside the function so `unlearn --help` stays fast."""

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
    "movielens",
    "plan",
)
