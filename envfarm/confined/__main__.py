from envfarm.confined.env_worker import main

main()
