from flywheel.cli import main

main()
