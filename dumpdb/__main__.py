from dumpdb.cli import main

main()
