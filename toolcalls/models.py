"""Models of this app come with its issue; the app is installed so migrations line up."""
