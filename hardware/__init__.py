"""robotrl.hardware: a robotrl policy on a ROS 2 robot. Robot files and the safety filter (numpy only), the chunk
executor, the MuJoCo sim robot, and the rclpy nodes (`robotrl-deploy`, `robotrl-sim-robot`, `robotrl-teleop`)
with their launch table. The only package that imports rclpy; it never imports torch training code."""
