from smgrl.cli import main

main()
