from smgrl.cli.entry import main

main()
