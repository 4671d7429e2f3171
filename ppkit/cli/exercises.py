"""``ppkit exercises``: every exercise of the course and how its last check went on this machine."""

from __future__ import annotations

HELP = "list the exercises and which pass on this machine (--verify: run every checker on its solution)"


def add_arguments(parser) -> None:
    parser.add_argument("--verify", action="store_true",
                        help="run every checker against its shipped solution here (about a minute): "
                             "does this machine run the exercises at all?")
    parser.epilog = ("Without --verify it reads your progress record, where each workbook.check() call is "
                     "written (`ppkit progress` says where). Exit status 1 when "
                     "--verify finds a checker that fails on its own solution.")


def main(args) -> int:
    from ppkit.exercises import workbook

    if not args.verify:
        workbook.progress()
        return 0
    from ppkit.errors import PPKitError
    from ppkit.exercises import catalog

    failed = []
    for exercise in catalog.EXERCISES:
        print(f"{exercise.notebook} {exercise.name}: ", end="", flush=True)
        try:
            workbook.verify_solution(exercise.name)
        except (PPKitError, AssertionError) as err:
            failed.append(exercise.name)
            print(f"FAILED on its own solution: {err}")
    print(f"{len(catalog.EXERCISES) - len(failed)} of {len(catalog.EXERCISES)} checkers pass on their "
          "solutions on this machine" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0
