from smgrl.cli.entry import main

# Guarded: a worker process that re-imports the parent's main module (multiprocessing's spawn, as
# the session workers use) must not run the CLI again.
if __name__ == "__main__":
    main()
