"""Build the compiled kernels now and say which 4-bit path this CPU runs."""

from quickdraft import kernels

if __name__ == "__main__":
    print(f"q4 kernels: {kernels.best_path()} ({', '.join(kernels.runnable_paths())} runnable)")
