# The example task of `make demo`: prints where it runs and writes a report
# under /output, which kiln uploads to S3.
import os
import platform

print("hello from", platform.node(), "kernel", platform.release())
os.makedirs("/output/report", exist_ok=True)
with open("/output/report/squares.csv", "w") as f:
    f.write("n,n2\n" + "".join(f"{i},{i * i}\n" for i in range(10)))
print("wrote /output/report/squares.csv")
