"""``ppkit progress``: the learner's own progress record (ppkit/progress/) as a table, or as JSON; and its
off switch."""

from __future__ import annotations

HELP = "show your progress record (exercises, errors, cluster runs) and switch it --off or --on"


def add_arguments(parser) -> None:
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--json", action="store_true", help="print the same as one JSON object")
    which.add_argument("--off", action="store_true",
                       help="stop recording (makes the file OFF in the record's folder; what is recorded stays)")
    which.add_argument("--on", action="store_true", help="record again (removes that file)")
    parser.epilog = ("The record is ~/ppkit-progress/record.jsonl and record.old.jsonl (PPKIT_RECORD_DIR names another "
                     "absolute folder), readable by you only, the same folder for a notebook's kernel, a terminal, "
                     "ssh or VS Code; under a Jupyter server rooted inside your home, ppkit-progress in that root is "
                     "a link to it. Nothing is sent anywhere; an instructor's `ppkit room --progress` reads it "
                     "through your own Jupyter server. PPKIT_RECORD=off in the environment also stops it.")


def main(args) -> int:
    import json

    from ppkit.progress import format as fmt
    from ppkit.progress import read, record, table

    folder = fmt.record_dir()
    if args.off or args.on:
        flag = record.switch(args.on, folder)
        if args.off:
            print(f"Progress recording is off ({flag} exists); `ppkit progress --on` turns it on again. "
                  "What was recorded stays; delete the folder to remove it. Checks from now on are not recorded, "
                  "so workbook.progress(), `ppkit exercises` and the instructor's room do not see them either.")
        else:
            print(f"Progress recording is on: checks, ppkit errors and cluster runs go to {folder}."
                  + (f" But {fmt.SWITCH_ENV}=off in the environment still stops it." if fmt.switched_off_by_env()
                     else ""))
        return 0
    found = read.read_folder(folder)
    course = table.exercises_by_notebook()
    if args.json:
        print(json.dumps(table.as_dict(found, folder, course), ensure_ascii=False))
    else:
        print(table.format_table(found, folder, course))
    return 0
