from envfarm.worker._main import main

main()
