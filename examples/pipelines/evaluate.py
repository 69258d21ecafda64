"""Reads cohort-train's metrics file (JSON lines) and writes the final test accuracy and the
training time as the step outputs `accuracy` and `train_seconds`."""
import json
import os
import sys

end = None
with open(sys.argv[1]) as f:
    for line in f:
        record = json.loads(line)
        if record.get("event") == "end":
            end = record
if end is None or "test_accuracy" not in end:
    sys.exit("no final test accuracy in %s (did training finish?)" % sys.argv[1])
out = os.environ["COHORT_OUTPUTS"]
with open(os.path.join(out, "accuracy"), "w") as f:
    f.write("%.4f\n" % end["test_accuracy"])
with open(os.path.join(out, "train_seconds"), "w") as f:
    f.write("%.1f\n" % end.get("train_s", 0.0))
print("test accuracy %.4f after %d steps" % (end["test_accuracy"], end.get("step", 0)))
