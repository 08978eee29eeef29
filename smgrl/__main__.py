from smgrl.entry import main

main()
